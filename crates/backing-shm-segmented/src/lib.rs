//! backing-shm-segmented
