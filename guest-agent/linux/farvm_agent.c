// SPDX-License-Identifier: GPL-2.0
/*
 * farvm guest agent: tells the farvm VMM which process runs on each vCPU, so its paging
 * engine keys prefetch histories and statistics by guest process.
 *
 * Binds to the farvm agent device (ACPI _HID "FARV0001", one MMIO register window; the ABI is
 * in farvm_agent_abi.h), negotiates a protocol version, registers one agent slot page per vCPU
 * and writes (pid, CR3, generation) into the running vCPU's slot from the sched_switch
 * tracepoint (and from sched_process_exec: exec changes the address space without a switch).
 * It also registers a process-event ring and offers /dev/farvm-agent, to which the
 * user-space daemon (farvm-agentd) writes process events (struct farvm_proc_event records):
 * the module validates them, queues them on the ring and rings the device's doorbell.
 *
 * Unloading the module unregisters everything before freeing the pages.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/acpi.h>
#include <linux/binfmts.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/io.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/platform_device.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/tracepoint.h>
#include <linux/uaccess.h>
#include <asm/smp.h>

#include "farvm_agent_abi.h"

/* Versions this module speaks; parameters so an old or new agent can be tried against a VMM. */
static unsigned int version_min = FARVM_AGENT_VERSION_MIN;
module_param(version_min, uint, 0444);
MODULE_PARM_DESC(version_min, "oldest agent-protocol version to offer (testing)");
static unsigned int version_max = FARVM_AGENT_VERSION;
module_param(version_max, uint, 0444);
MODULE_PARM_DESC(version_max, "newest agent-protocol version to offer (testing)");

/* Process-event ring: 255 records + the header = 4 pages. */
#define RING_CAPACITY 255
#define RING_ORDER 2

struct farvm_agent {
	struct device *dev;
	void __iomem *regs;
	u32 ncpus;
	u32 version;
	struct page *slot_pages;
	unsigned int slot_order;
	u32 nslots;
	struct page *ring_pages;
	struct farvm_ring_header *ring;
	struct farvm_proc_event *records;
	spinlock_t ring_lock; /* one producer at a time */
	struct mutex cmd_lock; /* COMMAND + RESULT pairs */
	bool tracing;
	bool tracing_exec;
	bool misc_registered;
};

/* The one bound device (the VMM offers one). */
static struct farvm_agent *agent;
/* The slot each Linux CPU writes (NULL: none for that CPU). */
static DEFINE_PER_CPU(struct farvm_agent_slot *, cpu_slot);
static struct tracepoint *sched_switch_tp;

static u32 reg_read(struct farvm_agent *a, u32 off)
{
	return readl(a->regs + off);
}

static void reg_write(struct farvm_agent *a, u32 off, u32 v)
{
	writel(v, a->regs + off);
}

/* Runs a device command; returns its FARVM_RESULT_*. */
static u32 command(struct farvm_agent *a, u32 cmd)
{
	u32 r;

	mutex_lock(&a->cmd_lock);
	reg_write(a, FARVM_REG_COMMAND, cmd);
	r = reg_read(a, FARVM_REG_RESULT);
	mutex_unlock(&a->cmd_lock);
	return r;
}

/* The highest version both sides speak, or 0. */
static u32 negotiate(u32 amin, u32 amax, u32 vmin, u32 vmax)
{
	u32 hi = min(amax, vmax), lo = max(amin, vmin);

	return hi >= lo ? hi : 0;
}

/* ---- sched_switch and exec: publish (pid, cr3) in this vCPU's slot ---- */

/* Writes (pid, cr3) into slot s under its seqlock (odd generation while writing). */
static void publish(struct farvm_agent_slot *s, u64 pid, u64 cr3)
{
	u64 g = READ_ONCE(s->generation);

	WRITE_ONCE(s->generation, g + 1); /* odd: writing */
	smp_wmb();
	WRITE_ONCE(s->pid, pid);
	WRITE_ONCE(s->cr3, cr3);
	WRITE_ONCE(s->switches, s->switches + 1);
	smp_wmb();
	WRITE_ONCE(s->generation, g + 2);
}

static void probe_sched_switch(void *data, bool preempt, struct task_struct *prev,
			       struct task_struct *next, unsigned int prev_state)
{
	struct farvm_agent_slot *s = this_cpu_read(cpu_slot);
	u64 pid = 0, cr3;

	if (!s)
		return;
	if (next->mm) {
		/* A user process: its thread-group id and page-table root. */
		pid = task_tgid_nr(next);
		cr3 = __pa(next->mm->pgd);
	} else {
		/*
		 * A kernel thread (pid 0) runs on the address space already loaded (lazy TLB):
		 * prev's, which stays in CR3.
		 */
		struct mm_struct *mm = prev->mm ? prev->mm : prev->active_mm;

		cr3 = mm ? __pa(mm->pgd) : READ_ONCE(s->cr3);
	}
	publish(s, pid, cr3);
}

/*
 * exec replaces the running task's address space without a context switch: publish the new
 * page-table root at once (the tracepoint fires after the new mm is installed), or a process
 * that keeps its vCPU would be known by its pre-exec address space until its next switch.
 */
static void probe_sched_process_exec(void *data, struct task_struct *p, pid_t old_pid,
				     struct linux_binprm *bprm)
{
	struct farvm_agent_slot *s = this_cpu_read(cpu_slot);

	if (!s || p != current || !p->mm)
		return;
	publish(s, task_tgid_nr(p), __pa(p->mm->pgd));
}

static struct tracepoint *sched_process_exec_tp;

static void find_tracepoints(struct tracepoint *tp, void *priv)
{
	if (!strcmp(tp->name, "sched_switch"))
		sched_switch_tp = tp;
	else if (!strcmp(tp->name, "sched_process_exec"))
		sched_process_exec_tp = tp;
}

/* ---- slots ---- */

static int register_slots(struct farvm_agent *a)
{
	unsigned int cpu;
	u32 i, r;
	phys_addr_t base;

	a->nslots = min_t(u32, a->ncpus, FARVM_MAX_SLOTS);
	a->slot_order = get_order((size_t)a->nslots * FARVM_SLOT_STRIDE);
	a->slot_pages = alloc_pages(GFP_KERNEL | __GFP_ZERO, a->slot_order);
	if (!a->slot_pages)
		return -ENOMEM;
	base = page_to_phys(a->slot_pages);
	for (i = 0; i < a->nslots; i++) {
		struct farvm_agent_slot *s = page_address(a->slot_pages) + i * FARVM_SLOT_STRIDE;

		s->magic = FARVM_SLOT_MAGIC;
		s->cpu = i;
		s->version = FARVM_ABI_VERSION;
	}
	/* Slot i belongs to the vCPU whose local APIC ID is i. */
	for_each_possible_cpu(cpu) {
		u32 apic = cpu_physical_id(cpu);

		per_cpu(cpu_slot, cpu) = apic < a->nslots ?
			page_address(a->slot_pages) + apic * FARVM_SLOT_STRIDE : NULL;
	}
	reg_write(a, FARVM_REG_SLOTS_LO, lower_32_bits(base));
	reg_write(a, FARVM_REG_SLOTS_HI, upper_32_bits(base));
	reg_write(a, FARVM_REG_SLOTS_COUNT, a->nslots);
	r = command(a, FARVM_CMD_REGISTER_SLOTS);
	if (r != FARVM_RESULT_OK) {
		dev_err(a->dev, "the VMM refused the agent slots (result %u)\n", r);
		return -EIO;
	}
	return 0;
}

static void free_slots(struct farvm_agent *a)
{
	unsigned int cpu;

	for_each_possible_cpu(cpu)
		per_cpu(cpu_slot, cpu) = NULL;
	if (a->slot_pages)
		__free_pages(a->slot_pages, a->slot_order);
	a->slot_pages = NULL;
}

/* ---- process-event ring and /dev/farvm-agent ---- */

static int register_ring(struct farvm_agent *a)
{
	phys_addr_t base;
	u32 r;

	a->ring_pages = alloc_pages(GFP_KERNEL | __GFP_ZERO, RING_ORDER);
	if (!a->ring_pages)
		return -ENOMEM;
	a->ring = page_address(a->ring_pages);
	a->records = (struct farvm_proc_event *)(a->ring + 1);
	a->ring->magic = FARVM_RING_MAGIC;
	a->ring->version = FARVM_RING_VERSION;
	a->ring->capacity = RING_CAPACITY;
	base = page_to_phys(a->ring_pages);
	reg_write(a, FARVM_REG_RING_LO, lower_32_bits(base));
	reg_write(a, FARVM_REG_RING_HI, upper_32_bits(base));
	reg_write(a, FARVM_REG_RING_BYTES, PAGE_SIZE << RING_ORDER);
	r = command(a, FARVM_CMD_REGISTER_RING);
	if (r != FARVM_RESULT_OK) {
		dev_err(a->dev, "the VMM refused the process ring (result %u)\n", r);
		return -EIO;
	}
	return 0;
}

/* Queues one event; false if the ring is full (counted in `dropped`). Caller holds ring_lock. */
static bool ring_push(struct farvm_agent *a, const struct farvm_proc_event *e)
{
	u64 head = a->ring->head, tail = READ_ONCE(a->ring->tail);

	if (head - tail >= RING_CAPACITY) {
		a->ring->dropped++;
		return false;
	}
	a->records[head % RING_CAPACITY] = *e;
	smp_wmb();
	WRITE_ONCE(a->ring->head, head + 1);
	return true;
}

static ssize_t agent_write(struct file *f, const char __user *buf, size_t len, loff_t *off)
{
	struct farvm_agent *a = agent;
	struct farvm_proc_event e;
	size_t done = 0;
	bool queued = false, full = false;

	if (!a || !a->ring)
		return -ENODEV;
	if (len % sizeof(e))
		return -EINVAL;
	while (done < len) {
		if (copy_from_user(&e, buf + done, sizeof(e)))
			return done ? done : -EFAULT;
		if (e.kind < FARVM_EVENT_PRESENT || e.kind > FARVM_EVENT_EXIT || !e.pid)
			return done ? done : -EINVAL;
		spin_lock(&a->ring_lock);
		full = !ring_push(a, &e);
		spin_unlock(&a->ring_lock);
		if (full) {
			/* Let the VMM drain it, then try once more. */
			reg_write(a, FARVM_REG_DOORBELL, 1);
			spin_lock(&a->ring_lock);
			full = !ring_push(a, &e);
			spin_unlock(&a->ring_lock);
		}
		queued = true;
		done += sizeof(e);
	}
	if (queued)
		reg_write(a, FARVM_REG_DOORBELL, 1);
	return done;
}

static const struct file_operations agent_fops = {
	.owner = THIS_MODULE,
	.write = agent_write,
	.llseek = noop_llseek,
};

static struct miscdevice agent_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "farvm-agent",
	.fops = &agent_fops,
	.mode = 0200,
};

/* ---- the platform driver ---- */

static void teardown(struct farvm_agent *a)
{
	if (a->misc_registered)
		misc_deregister(&agent_misc);
	a->misc_registered = false;
	if (a->tracing_exec) {
		tracepoint_probe_unregister(sched_process_exec_tp, probe_sched_process_exec, NULL);
		a->tracing_exec = false;
	}
	if (a->tracing) {
		tracepoint_probe_unregister(sched_switch_tp, probe_sched_switch, NULL);
		tracepoint_synchronize_unregister();
		a->tracing = false;
	}
	/* After RESET returns the VMM no longer reads the slots or the ring. */
	if (a->version)
		command(a, FARVM_CMD_RESET);
	free_slots(a);
	if (a->ring_pages)
		__free_pages(a->ring_pages, RING_ORDER);
	a->ring_pages = NULL;
	a->ring = NULL;
}

static int farvm_agent_probe(struct platform_device *pdev)
{
	struct farvm_agent *a;
	struct resource *res;
	u32 magic, vmin, vmax, v, r;
	int err;

	if (agent)
		return -EBUSY;
	a = devm_kzalloc(&pdev->dev, sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	a->dev = &pdev->dev;
	spin_lock_init(&a->ring_lock);
	mutex_init(&a->cmd_lock);
	res = platform_get_resource(pdev, IORESOURCE_MEM, 0);
	if (!res || resource_size(res) < FARVM_WINDOW_SIZE)
		return dev_err_probe(a->dev, -ENODEV, "no register window\n");
	a->regs = devm_ioremap(a->dev, res->start, FARVM_WINDOW_SIZE);
	if (!a->regs)
		return -ENOMEM;
	magic = reg_read(a, FARVM_REG_MAGIC);
	if (magic != FARVM_DEVICE_MAGIC)
		return dev_err_probe(a->dev, -ENODEV, "not a farvm agent device (magic %#x)\n", magic);
	vmin = reg_read(a, FARVM_REG_VERSION_MIN);
	vmax = reg_read(a, FARVM_REG_VERSION_MAX);
	a->ncpus = reg_read(a, FARVM_REG_NCPUS);
	v = negotiate(version_min, version_max, vmin, vmax);
	/* Nothing in common: still tell the VMM our version, so it logs the refusal too. */
	reg_write(a, FARVM_REG_VERSION, v ? v : version_max);
	r = reg_read(a, FARVM_REG_RESULT);
	if (!v || r != FARVM_RESULT_OK) {
		dev_err(a->dev,
			"agent protocol: this module speaks v%u..v%u, the VMM v%u..v%u: no common version, not attaching (farvm keeps one global history)\n",
			version_min, version_max, vmin, vmax);
		return -EPROTONOSUPPORT;
	}
	a->version = v;
	if (v < version_max)
		dev_info(a->dev, "agent protocol v%u (the VMM is older than this module's v%u)\n", v,
			 version_max);
	if (!a->ncpus) {
		dev_err(a->dev, "the VMM reports 0 vCPUs\n");
		err = -EIO;
		goto fail;
	}
	err = register_slots(a);
	if (err)
		goto fail;
	for_each_kernel_tracepoint(find_tracepoints, NULL);
	if (!sched_switch_tp || !sched_process_exec_tp) {
		dev_err(a->dev, "no sched_switch or sched_process_exec tracepoint in this kernel\n");
		err = -ENOENT;
		goto fail;
	}
	err = tracepoint_probe_register(sched_switch_tp, probe_sched_switch, NULL);
	if (err) {
		dev_err(a->dev, "cannot attach to sched_switch: %d\n", err);
		goto fail;
	}
	a->tracing = true;
	err = tracepoint_probe_register(sched_process_exec_tp, probe_sched_process_exec, NULL);
	if (err) {
		dev_err(a->dev, "cannot attach to sched_process_exec: %d\n", err);
		goto fail;
	}
	a->tracing_exec = true;
	err = register_ring(a);
	if (err)
		goto fail;
	agent = a;
	err = misc_register(&agent_misc);
	if (err) {
		agent = NULL;
		goto fail;
	}
	a->misc_registered = true;
	platform_set_drvdata(pdev, a);
	dev_info(a->dev, "attached: agent protocol v%u, %u vCPU slots, process ring of %u records\n",
		 v, a->nslots, RING_CAPACITY);
	return 0;
fail:
	teardown(a);
	return err;
}

static void farvm_agent_remove(struct platform_device *pdev)
{
	struct farvm_agent *a = platform_get_drvdata(pdev);

	if (!a)
		return;
	teardown(a);
	agent = NULL;
	dev_info(a->dev, "detached\n");
}

static const struct acpi_device_id farvm_agent_acpi_ids[] = {
	{ FARVM_ACPI_HID, 0 },
	{}
};
MODULE_DEVICE_TABLE(acpi, farvm_agent_acpi_ids);

static struct platform_driver farvm_agent_driver = {
	.probe = farvm_agent_probe,
	.remove_new = farvm_agent_remove,
	.driver = {
		.name = "farvm-agent",
		.acpi_match_table = farvm_agent_acpi_ids,
	},
};
module_platform_driver(farvm_agent_driver);

MODULE_DESCRIPTION("farvm guest agent: per-process attribution of remote-memory paging");
MODULE_LICENSE("GPL");
