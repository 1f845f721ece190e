//! hipfire-model (being built).
