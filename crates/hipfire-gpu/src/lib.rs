//! hipfire-gpu (being built).
