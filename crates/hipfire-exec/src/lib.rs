//! hipfire-exec (being built).
