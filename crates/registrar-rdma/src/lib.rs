//! registrar-rdma
