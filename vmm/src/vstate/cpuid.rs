//! Per-vCPU CPUID: KVM's supported set with this vCPU's APIC id and topology patched in, and
//! KVM's paravirtual leaves as a Linux guest needs them.
//!
//! KVM's supported set already holds the KVM signature leaf (0x4000_0000, "KVMKVMKVM\0\0\0")
//! and the KVM feature leaf (0x4000_0001), so a Linux guest finds kvmclock (its clock source
//! and TSC frequency) there without calibrating against the PIT.

use kvm_bindings::CpuId;

const LEAF_FEATURES: u32 = 1;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const ECX_X2APIC: u32 = 1 << 21;
const ECX_HYPERVISOR: u32 = 1 << 31;
/// KVM's paravirtual feature leaf (EAX: `KVM_FEATURE_*` bits).
pub const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
/// The KVM signature leaf.
pub const LEAF_KVM_SIGNATURE: u32 = 0x4000_0000;
/// `KVM_FEATURE_CLOCKSOURCE2` (kvmclock through the new MSRs).
pub const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// `KVM_FEATURE_ASYNC_PF`, `KVM_FEATURE_ASYNC_PF_VMEXIT`, `KVM_FEATURE_ASYNC_PF_INT`.
pub const KVM_FEATURES_ASYNC_PF: u32 = (1 << 4) | (1 << 10) | (1 << 14);

/// Patches `cpuid` for vCPU `index` of `ncpus`: initial APIC id (leaf 1 EBX\[31:24\]), x2APIC id
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

/// Clears KVM's paravirtual async page faults from the feature leaf, so the guest never
/// enables them: a fault on a page the host must bring in (remote memory) then stays the
/// vCPU's own instead of being turned into a guest #PF or interrupt and a reschedule inside
/// the guest. kvmclock and the other paravirtual features stay.
pub fn hide_async_pf(cpuid: &mut CpuId) {
    for e in cpuid.as_mut_slice() {
        if e.function == LEAF_KVM_FEATURES {
            e.eax &= !KVM_FEATURES_ASYNC_PF;
        }
    }
}

/// Whether `cpuid` offers kvmclock (the KVM signature and CLOCKSOURCE2).
pub fn has_kvmclock(cpuid: &CpuId) -> bool {
    let s = cpuid.as_slice();
    let signature = s.iter().any(|e| {
        e.function == LEAF_KVM_SIGNATURE
            && [e.ebx, e.ecx, e.edx] == [0x4b4d_564b, 0x564b_4d56, 0x4d]
    });
    let clock = s
        .iter()
        .any(|e| e.function == LEAF_KVM_FEATURES && e.eax & KVM_FEATURE_CLOCKSOURCE2 != 0);
    signature && clock
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    fn leaf(function: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    /// KVM's leaves as the development host reports them.
    fn supported() -> CpuId {
        CpuId::from_entries(&[
            leaf(1, 0x806f8, 0x0001_0800, 0x0, 0x0),
            leaf(0xb, 0, 0, 0, 0),
            leaf(
                LEAF_KVM_SIGNATURE,
                0x4000_0001,
                0x4b4d_564b,
                0x564b_4d56,
                0x4d,
            ),
            leaf(LEAF_KVM_FEATURES, 0x0100_7efb, 0, 0, 0),
        ])
        .unwrap()
    }

    #[test]
    fn apic_ids_and_topology_per_vcpu() {
        let mut c = supported();
        patch(&mut c, 3, 4);
        let e = &c.as_slice()[0];
        assert_eq!(e.ebx >> 24, 3, "initial APIC id");
        assert_eq!((e.ebx >> 16) & 0xff, 4, "logical processors");
        assert_eq!(e.ebx & 0xffff, 0x0800, "the rest kept");
        assert_ne!(e.ecx & ECX_HYPERVISOR, 0);
        assert_eq!(c.as_slice()[1].edx, 3, "x2APIC id");
    }

    #[test]
    fn async_pf_is_hidden_and_kvmclock_stays() {
        let mut c = supported();
        assert!(has_kvmclock(&c));
        hide_async_pf(&mut c);
        let features = c.as_slice()[3].eax;
        assert_eq!(features & KVM_FEATURES_ASYNC_PF, 0);
        assert_eq!(features, 0x0100_7efb & !KVM_FEATURES_ASYNC_PF);
        assert!(has_kvmclock(&c), "kvmclock survives");
        // A set without KVM's leaves offers no kvmclock.
        let bare = CpuId::from_entries(&[leaf(1, 0, 0, 0, 0)]).unwrap();
        assert!(!has_kvmclock(&bare));
    }
}
