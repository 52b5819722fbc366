//! farvm-memserver: remote page store (server) and the client the VMM uses.
