//! pinner-cuda
