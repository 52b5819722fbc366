//! farvm-ept: the guest-memory paging engine (userfaultfd fault path, page states, injection, eviction).
