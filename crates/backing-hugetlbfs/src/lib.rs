//! backing-hugetlbfs
