/* SPDX-License-Identifier: Apache-2.0 */
/*
 * farvm guest/VMM ABI for C guest agents: the per-vCPU agent slot, the agent device's registers
 * and the process-event ring. Mirrors the Rust crate farvm-guest-agent (src/slot.rs,
 * src/device.rs) byte for byte; guest-agent/tests/c_header.rs compiles this header and checks
 * every constant, size and offset against the Rust definitions.
 *
 * Usable from the kernel and from user space (only <linux/types.h>).
 */
#ifndef FARVM_AGENT_ABI_H
#define FARVM_AGENT_ABI_H

#include <linux/types.h>

/* ---- agent slot (one per vCPU, at the start of its own 4 KiB page) ---- */

#define FARVM_SLOT_MAGIC 0x544c534d56524146ULL /* "FARVMSLT" little-endian */
#define FARVM_ABI_VERSION 1

struct farvm_agent_slot {
	__u64 magic;      /* FARVM_SLOT_MAGIC */
	__u64 generation; /* seqlock: odd while the guest writes */
	__u32 cpu;        /* vCPU (local APIC ID) */
	__u32 version;    /* FARVM_ABI_VERSION */
	__u64 pid;        /* process running now (thread-group id; 0 = kernel) */
	__u64 cr3;        /* its page-table root (guest-physical, low 12 bits clear) */
	__u64 switches;   /* context switches on this vCPU */
};

/* ---- agent device: ACPI _HID "FARV0001", one MMIO window of 32-bit registers ---- */

#define FARVM_ACPI_HID "FARV0001"
#define FARVM_WINDOW_SIZE 0x1000
#define FARVM_DEVICE_MAGIC 0x56524146U /* "FARV" little-endian */
#define FARVM_AGENT_VERSION 1
#define FARVM_AGENT_VERSION_MIN 1
#define FARVM_SLOT_STRIDE 4096
#define FARVM_MAX_SLOTS 256

#define FARVM_REG_MAGIC 0x00
#define FARVM_REG_VERSION_MAX 0x04
#define FARVM_REG_VERSION_MIN 0x08
#define FARVM_REG_NCPUS 0x0C
#define FARVM_REG_FEATURES 0x10
#define FARVM_REG_VERSION 0x14
#define FARVM_REG_STATUS 0x18
#define FARVM_REG_RESULT 0x1C
#define FARVM_REG_SLOTS_LO 0x20
#define FARVM_REG_SLOTS_HI 0x24
#define FARVM_REG_SLOTS_COUNT 0x28
#define FARVM_REG_RING_LO 0x30
#define FARVM_REG_RING_HI 0x34
#define FARVM_REG_RING_BYTES 0x38
#define FARVM_REG_COMMAND 0x40
#define FARVM_REG_DOORBELL 0x44
#define FARVM_REG_RING_TAKEN 0x48
#define FARVM_REG_RING_REFUSED 0x4C

#define FARVM_CMD_REGISTER_SLOTS 1
#define FARVM_CMD_UNREGISTER_SLOTS 2
#define FARVM_CMD_REGISTER_RING 3
#define FARVM_CMD_UNREGISTER_RING 4
#define FARVM_CMD_RESET 5

#define FARVM_RESULT_OK 0
#define FARVM_RESULT_BAD_VERSION 1
#define FARVM_RESULT_NOT_NEGOTIATED 2
#define FARVM_RESULT_BAD_ADDRESS 3
#define FARVM_RESULT_BAD_COUNT 4
#define FARVM_RESULT_UNKNOWN_COMMAND 5
#define FARVM_RESULT_BAD_RING 6

#define FARVM_STATUS_NEGOTIATED (1U << 0)
#define FARVM_STATUS_SLOTS (1U << 1)
#define FARVM_STATUS_RING (1U << 2)

#define FARVM_FEATURE_SLOTS (1U << 0)
#define FARVM_FEATURE_PROCESS_RING (1U << 1)

/* ---- process-event ring (registered with FARVM_CMD_REGISTER_RING) ---- */

#define FARVM_RING_MAGIC 0x474e524d56524146ULL /* "FARVMRNG" little-endian */
#define FARVM_RING_VERSION 1
#define FARVM_RING_MAX_CAPACITY 4096
#define FARVM_NAME_BYTES 40

#define FARVM_EVENT_PRESENT 1
#define FARVM_EVENT_START 2
#define FARVM_EVENT_RENAME 3
#define FARVM_EVENT_EXIT 4

struct farvm_ring_header {
	__u64 magic;    /* FARVM_RING_MAGIC */
	__u32 version;  /* FARVM_RING_VERSION */
	__u32 capacity; /* records after the header */
	__u64 head;     /* records written (guest) */
	__u64 tail;     /* records taken (VMM) */
	__u64 dropped;  /* records the guest could not queue (ring full) */
	__u64 reserved[3];
};

struct farvm_proc_event {
	__u32 kind; /* FARVM_EVENT_* */
	__u32 pid;  /* thread-group id */
	__u32 ppid;
	__u32 uid;
	__u64 time_ns; /* guest CLOCK_BOOTTIME */
	char name[FARVM_NAME_BYTES]; /* UTF-8, NUL-padded, not necessarily NUL-terminated */
};

#endif /* FARVM_AGENT_ABI_H */
