//! farvm-workloads: the test guest's workloads, `no_std`, also built natively.
#![no_std]
