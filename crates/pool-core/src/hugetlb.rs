//! Huge page pools and tmpfs capacity (being written).
