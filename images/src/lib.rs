//! farvm-images: guest images built from this repository.
