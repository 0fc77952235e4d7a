/*
 * NUMA placement (node/meshd/numa_topo.c) with an injected topology: a fake sysfs tree in a temp
 * directory with devices on nodes 0 and 1 and CPUs per node, the cpulist format both ways, the
 * policy (auto / off / forced node / the application's hint), and on this machine the placement of
 * real pages.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "numa_topo.h"
#include "unit_main.h"

/* ---- the fake sysfs ---- */

struct tree {
	char root[PATH_MAX];
};

static void put(struct tree *t, const char *rel, const char *text)
{
	char path[PATH_MAX * 2];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", t->root, rel);
	for (char *p = path + strlen(t->root) + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			mkdir(path, 0755);
			*p = '/';
		}
	}
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int tree_setup(void **state)
{
	struct tree *t = calloc(1, sizeof(*t));
	const char *dir = getenv("TMPDIR");

	if (!t)
		return -1;
	snprintf(t->root, sizeof(t->root), "%s/numa-XXXXXX", dir && *dir ? dir : "/tmp");
	if (!mkdtemp(t->root))
		return -1;
	*state = t;
	return 0;
}

static int tree_teardown(void **state)
{
	struct tree *t = *state;
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->root);
	if (system(cmd))
		return -1;
	free(t);
	return 0;
}

/* Two nodes of four CPUs; mlx5_0 on node 0, mlx5_1 on node 1, rxe0 on a netdev of node 1, rxe1 on
 * a virtual netdev (no device: no affinity). */
static void two_node_machine(struct tree *t)
{
	put(t, "sys/devices/system/node/online", "0-1\n");
	put(t, "sys/devices/system/node/node0/cpulist", "0-3\n");
	put(t, "sys/devices/system/node/node1/cpulist", "4-7\n");
	put(t, "sys/class/infiniband/mlx5_0/device/numa_node", "0\n");
	put(t, "sys/class/infiniband/mlx5_1/device/numa_node", "1\n");
	put(t, "sys/class/infiniband/rxe0/parent", "eth1\n");
	put(t, "sys/class/net/eth1/device/numa_node", "1\n");
	put(t, "sys/class/infiniband/rxe1/parent", "dummy0\n");
}

static const struct numa_dev *dev(const struct numa_topo *topo, const char *name)
{
	const struct numa_dev *d = numa_topo_dev(topo, name);

	if (!d)
		fail_msg("device %s not found", name);
	return d;
}

/* ---- cpulists ---- */

static void numa_cpulist_parse__ranges_and_singles__exact_set(void **state)
{
	cpu_set_t set;
	const int want[] = {0, 1, 2, 3, 8, 10, 11};

	(void)state;
	assert_int_equal(numa_cpulist_parse("0-3,8,10-11\n", &set), 0);
	assert_int_equal(CPU_COUNT(&set), 7);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		assert_true(CPU_ISSET(want[i], &set));
	assert_false(CPU_ISSET(4, &set));
}

static void numa_cpulist_parse__empty__empty_set(void **state)
{
	cpu_set_t set;

	(void)state;
	/* A memory-only node has an empty cpulist. */
	assert_int_equal(numa_cpulist_parse("", &set), 0);
	assert_int_equal(CPU_COUNT(&set), 0);
	assert_int_equal(numa_cpulist_parse("\n", &set), 0);
	assert_int_equal(CPU_COUNT(&set), 0);
}

static void numa_cpulist_parse__garbage__einval(void **state)
{
	static const char *const bad[] = {"a", "1-", "3-1", "1,,2", "1,", ",1", "99999", "1 2", "-1", "1\nx", "0-70000"};
	cpu_set_t set;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (numa_cpulist_parse(bad[i], &set) != -EINVAL)
			fail_msg("\"%s\" was accepted", bad[i]);
}

static void numa_cpulist_format__set__compact_ranges_that_parse_back(void **state)
{
	cpu_set_t set, back;
	char buf[64];

	(void)state;
	CPU_ZERO(&set);
	for (int c = 0; c < 3; c++)
		CPU_SET(c, &set);
	CPU_SET(5, &set);
	CPU_SET(7, &set);
	CPU_SET(8, &set);
	assert_string_equal(numa_cpulist_format(&set, buf, sizeof(buf)), "0-2,5,7-8");
	assert_int_equal(numa_cpulist_parse(buf, &back), 0);
	assert_true(CPU_EQUAL(&set, &back));
	CPU_ZERO(&set);
	assert_string_equal(numa_cpulist_format(&set, buf, sizeof(buf)), "");
}

/* ---- the topology ---- */

static void numa_topo_load__two_nodes_four_devices__nodes_cpus_and_device_nodes(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[256] = "";
	cpu_set_t want;

	two_node_machine(t);
	if (numa_topo_load(&topo, t->root, why, sizeof(why)))
		fail_msg("numa_topo_load: %s", why);
	assert_int_equal(topo.n_nodes, 2);
	assert_int_equal(topo.n_online, 2);
	assert_int_equal(numa_cpulist_parse("4-7", &want), 0);
	assert_true(CPU_EQUAL(&topo.cpus[1], &want));
	assert_int_equal(topo.n_devs, 4);
	assert_int_equal(dev(&topo, "mlx5_0")->node, 0);
	assert_int_equal(dev(&topo, "mlx5_1")->node, 1);
	/* Soft-RoCE: the node of the netdev under it. */
	assert_int_equal(dev(&topo, "rxe0")->node, 1);
	assert_string_equal(dev(&topo, "rxe0")->netdev, "eth1");
	/* On a virtual netdev: no affinity. */
	assert_int_equal(dev(&topo, "rxe1")->node, -1);
	assert_int_equal(numa_topo_dev(&topo, "mlx5_1")->node, 1);
	assert_null(numa_topo_dev(&topo, "nosuch"));
}

static void numa_topo_load__no_node_directory__one_node_with_online_cpus(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[256] = "";

	put(t, "sys/devices/system/cpu/online", "0-1\n");
	if (numa_topo_load(&topo, t->root, why, sizeof(why)))
		fail_msg("numa_topo_load: %s", why);
	assert_int_equal(topo.n_nodes, 1);
	assert_int_equal(topo.n_online, 1);
	assert_int_equal(CPU_COUNT(&topo.cpus[0]), 2);
	assert_int_equal(topo.n_devs, 0);
}

static void numa_topo_load__malformed_cpulist__error_names_the_file(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[PATH_MAX + 64] = "";

	put(t, "sys/devices/system/node/online", "0-1\n");
	put(t, "sys/devices/system/node/node0/cpulist", "0-3\n");
	put(t, "sys/devices/system/node/node1/cpulist", "4-x\n");
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "node1/cpulist"));
	assert_non_null(strstr(why, "malformed"));
}

static void numa_topo_load__device_on_an_offline_or_bogus_node__no_affinity(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[PATH_MAX + 64] = "";

	two_node_machine(t);
	put(t, "sys/class/infiniband/mlx5_9/device/numa_node", "5\n");
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), 0);
	assert_int_equal(dev(&topo, "mlx5_9")->node, -1);
	/* Not a number at all: an error naming the file, not a guess. */
	put(t, "sys/class/infiniband/mlx5_9/device/numa_node", "near\n");
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "mlx5_9/device/numa_node"));
}

static void numa_netdev_node__hostile_names__no_affinity_without_leaving_sysfs(void **state)
{
	struct tree *t = *state;

	two_node_machine(t);
	put(t, "sys/class/x/device/numa_node", "1\n");
	assert_int_equal(numa_netdev_node(t->root, "eth1"), 1);
	assert_int_equal(numa_netdev_node(t->root, "../x"), -1);
	assert_int_equal(numa_netdev_node(t->root, ".."), -1);
	assert_int_equal(numa_netdev_node(t->root, ""), -1);
	assert_int_equal(numa_netdev_node(t->root, "lo"), -1);
}

/* virtio-net (a VM's NIC on a PCI root bus of node 1): the netdev's device is the virtio device,
 * whose parent, the PCI function, has the node. */
static void numa_netdev_node__virtio_nic__node_of_the_pci_parent(void **state)
{
	struct tree *t = *state;
	char link[PATH_MAX * 2];

	two_node_machine(t);
	put(t, "sys/devices/pci0000:20/0000:21:00.0/numa_node", "1\n");
	put(t, "sys/devices/pci0000:20/0000:21:00.0/virtio1/features", "0\n");
	put(t, "sys/class/net/rail1/mtu", "1500\n");
	snprintf(link, sizeof(link), "%s/sys/class/net/rail1/device", t->root);
	assert_int_equal(symlink("../../../devices/pci0000:20/0000:21:00.0/virtio1", link), 0);
	put(t, "sys/class/infiniband/rxe_rail1/parent", "rail1\n");
	assert_int_equal(numa_netdev_node(t->root, "rail1"), 1);
}

/* ---- several devices (rails) ---- */

static void numa_rail_pick__wanted_node__that_nodes_device_else_rail_0(void **state)
{
	const int nodes[3] = {0, 1, -1};

	(void)state;
	assert_int_equal(numa_rail_pick(nodes, 3, 1), 1);
	assert_int_equal(numa_rail_pick(nodes, 3, 0), 0);
	assert_int_equal(numa_rail_pick(nodes, 3, -1), 0); /* nothing wanted */
	assert_int_equal(numa_rail_pick(nodes, 3, 5), 0);  /* no device there */
	assert_int_equal(numa_rail_pick(nodes, 1, 1), 0);  /* one rail */
	/* devices on the same node: the first */
	{
		const int same[2] = {1, 1};

		assert_int_equal(numa_rail_pick(same, 2, 1), 0);
	}
}

static void numa_ring_node__hint_device_home__in_that_order(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[256];

	two_node_machine(t);
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), 0);
	assert_int_equal(numa_ring_node(&topo, true, true, 0, 1, -1), 1);  /* the device's node */
	assert_int_equal(numa_ring_node(&topo, true, true, 0, 1, 0), 0);   /* the hint wins */
	assert_int_equal(numa_ring_node(&topo, true, true, 0, -1, -1), 0); /* device without affinity: home */
	assert_int_equal(numa_ring_node(&topo, true, false, 0, 1, -1), 0); /* numa = <node>: home */
	assert_int_equal(numa_ring_node(&topo, true, true, 0, 9, -1), 0);  /* a node we lack: home */
	assert_int_equal(numa_ring_node(&topo, false, true, -1, 1, -1), -1); /* cannot place */
	assert_int_equal(numa_ring_node(&topo, true, true, 0, 1, 7), -EINVAL);
}

/* ---- policy ---- */

static void numa_home__each_mode__node_and_reason(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[256];
	const char *w;
	bool usable;

	two_node_machine(t);
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), 0);
	usable = numa_usable(&topo, true, &w);
	assert_true(usable);
	/* auto: the device's node */
	assert_int_equal(numa_home(&topo, usable, NUMA_AUTO, dev(&topo, "mlx5_1")->node, &w), 1);
	assert_int_equal(numa_home(&topo, usable, NUMA_AUTO, dev(&topo, "mlx5_0")->node, &w), 0);
	/* auto on a device without affinity: unplaced, and says so */
	assert_int_equal(numa_home(&topo, usable, NUMA_AUTO, dev(&topo, "rxe1")->node, &w), -1);
	assert_non_null(strstr(w, "no NUMA affinity"));
	/* a forced node wins over the device's */
	assert_int_equal(numa_home(&topo, usable, 0, 1, &w), 0);
	/* a node this machine lacks: unplaced */
	assert_int_equal(numa_home(&topo, usable, 7, 1, &w), -1);
	assert_non_null(strstr(w, "does not have"));
	/* off */
	assert_int_equal(numa_home(&topo, usable, NUMA_OFF, 1, &w), -1);
	assert_non_null(strstr(w, "off"));
	/* without libnuma at run time nothing is placed */
	assert_false(numa_usable(&topo, false, &w));
	assert_non_null(strstr(w, "libnuma"));
	assert_int_equal(numa_home(&topo, false, NUMA_AUTO, 1, &w), -1);
}

static void numa_usable__one_node__false_with_reason(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[256];
	const char *w;

	put(t, "sys/devices/system/node/online", "0\n");
	put(t, "sys/devices/system/node/node0/cpulist", "0-1\n");
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), 0);
	assert_false(numa_usable(&topo, true, &w));
	assert_non_null(strstr(w, "one NUMA node"));
}

static void numa_channel_node__hint__overrides_home_or_einval(void **state)
{
	struct tree *t = *state;
	struct numa_topo topo;
	char why[256];

	two_node_machine(t);
	assert_int_equal(numa_topo_load(&topo, t->root, why, sizeof(why)), 0);
	assert_int_equal(numa_channel_node(&topo, true, 1, -1), 1); /* no hint: home */
	assert_int_equal(numa_channel_node(&topo, true, 1, 0), 0);  /* the hint wins */
	assert_int_equal(numa_channel_node(&topo, true, -1, 1), 1);
	assert_int_equal(numa_channel_node(&topo, true, 1, 2), -EINVAL);
	assert_int_equal(numa_channel_node(&topo, true, 1, 63), -EINVAL);
	/* A valid hint where placement is impossible: unplaced, not an error. */
	assert_int_equal(numa_channel_node(&topo, false, -1, 1), -1);
}

/* ---- this machine ---- */

static void numa_place__node_0__pages_faulted_in_on_node_0(void **state)
{
	size_t len = 16 * 4096;
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	const void *pages[3];

	(void)state;
	assert_true(p != MAP_FAILED);
	if (!numa_lib_ok()) {
		/* A kernel without NUMA: nothing to place. ctest reports 77 as skipped, not passed. */
		print_message("skip: libnuma is not available at run time\n");
		exit(77);
	}
	/* Untouched anonymous pages are not present: the kernel knows no node yet. */
	pages[0] = p;
	assert_int_equal(numa_pages_node(pages, 1), -1);
	assert_int_equal(numa_place(p, len, 0), 0);
	pages[0] = p;
	pages[1] = p + 7 * 4096;
	pages[2] = p + 15 * 4096;
	assert_int_equal(numa_pages_node(pages, 3), 0);
	assert_int_equal(numa_page_node(p + 4096), 0);
	/* Contents are untouched by the faulting. */
	for (size_t i = 0; i < len; i += 4096)
		assert_int_equal(p[i], 0);
	munmap(p, len);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tree_setup, tree_teardown)

static const struct CMUnitTest tests[] = {
	T(numa_cpulist_parse__ranges_and_singles__exact_set),
	T(numa_cpulist_parse__empty__empty_set),
	T(numa_cpulist_parse__garbage__einval),
	T(numa_cpulist_format__set__compact_ranges_that_parse_back),
	T(numa_topo_load__two_nodes_four_devices__nodes_cpus_and_device_nodes),
	T(numa_topo_load__no_node_directory__one_node_with_online_cpus),
	T(numa_topo_load__malformed_cpulist__error_names_the_file),
	T(numa_topo_load__device_on_an_offline_or_bogus_node__no_affinity),
	T(numa_netdev_node__hostile_names__no_affinity_without_leaving_sysfs),
	T(numa_netdev_node__virtio_nic__node_of_the_pci_parent),
	T(numa_rail_pick__wanted_node__that_nodes_device_else_rail_0),
	T(numa_ring_node__hint_device_home__in_that_order),
	T(numa_home__each_mode__node_and_reason),
	T(numa_usable__one_node__false_with_reason),
	T(numa_channel_node__hint__overrides_home_or_einval),
	T(numa_place__node_0__pages_faulted_in_on_node_0),
};

UNIT_MAIN("numa", tests, NULL, NULL)
