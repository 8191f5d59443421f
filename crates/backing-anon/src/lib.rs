//! backing-anon
