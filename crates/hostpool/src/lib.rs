//! hostpool
