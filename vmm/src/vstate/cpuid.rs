//! Per-vCPU CPUID: KVM's supported set with this vCPU's APIC id and topology patched in.

use kvm_bindings::CpuId;

const LEAF_FEATURES: u32 = 1;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const ECX_X2APIC: u32 = 1 << 21;
const ECX_HYPERVISOR: u32 = 1 << 31;

/// Patches `cpuid` for vCPU `index` of `ncpus`: initial APIC id (leaf 1 EBX[31:24]), x2APIC id
/// (leaves 0xB/0x1F EDX), logical processor count, x2APIC and hypervisor bits.
pub fn patch(cpuid: &mut CpuId, index: u32, ncpus: u32) {
    for e in cpuid.as_mut_slice() {
        match e.function {
            LEAF_FEATURES => {
                e.ebx = (e.ebx & 0x0000_ffff) | (index << 24) | ((ncpus.min(255)) << 16);
                e.ecx |= ECX_X2APIC | ECX_HYPERVISOR;
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => {
                e.edx = index;
            }
            _ => {}
        }
    }
}
