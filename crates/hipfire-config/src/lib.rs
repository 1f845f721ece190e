//! hipfire-config (being built).
