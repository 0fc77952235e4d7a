/*
 * NUMA placement: where meshd's data-path thread runs and where a channel's rings and registered
 * memory live. Cross-socket DMA is where RDMA throughput silently halves, so everything a NIC
 * touches goes on the NIC's node.
 *
 * The topology is read from sysfs under a root directory ("/" in meshd, a fake tree in the unit
 * tests): the online nodes and their CPUs (/sys/devices/system/node), each RDMA device's node
 * (/sys/class/infiniband/DEV/device/numa_node, or for Soft-RoCE the node of the netdev named in
 * DEV/parent) and a netdev's node (/sys/class/net/IF/device/numa_node). -1 means no affinity: a
 * virtual device, or a machine with one node.
 *
 * Policy (cluster.numa): "auto" places on the device's node, "off" never places, a node number
 * forces that node. Placement needs libnuma at run time and more than one node; without either
 * everything runs unplaced, and meshctl node says why.
 */
#ifndef MESH_MESHD_NUMA_TOPO_H
#define MESH_MESHD_NUMA_TOPO_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#define NUMA_NODES_MAX 64
#define NUMA_DEVS_MAX 16
#define NUMA_NAME_MAX 32

#define NUMA_AUTO (-1) /* cluster.numa = "auto" */
#define NUMA_OFF (-2)  /* cluster.numa = "off" */

struct numa_dev {
	char name[NUMA_NAME_MAX];   /* rxe0, mlx5_0 */
	char netdev[NUMA_NAME_MAX]; /* Soft-RoCE: the netdev under it, else "" */
	int node;                   /* -1: no affinity */
};

struct numa_topo {
	int n_nodes;                   /* highest online node + 1 (1 on a machine without NUMA) */
	int n_online;                  /* online nodes with CPUs */
	bool online[NUMA_NODES_MAX];
	cpu_set_t cpus[NUMA_NODES_MAX]; /* of each online node */
	size_t n_devs;
	struct numa_dev devs[NUMA_DEVS_MAX];
};

/* "0-3,8,10-11" (sysfs cpulist format, trailing newline allowed) into set. 0, or -EINVAL for
 * anything else (a number beyond CPU_SETSIZE included). */
int numa_cpulist_parse(const char *s, cpu_set_t *set);
/* The reverse; an empty set prints "". Returns buf. */
char *numa_cpulist_format(const cpu_set_t *set, char *buf, size_t len);

/* Reads the topology under root (NULL: "/"). Missing files are not errors (no NUMA: one node with
 * every online CPU; a device without a node: -1); unreadable or malformed ones are, with *why set
 * to the file. 0 or a negative errno. */
int numa_topo_load(struct numa_topo *t, const char *root, char *why, size_t whylen);
/* RDMA device name of the topology, or NULL when sysfs does not list it. */
const struct numa_dev *numa_topo_dev(const struct numa_topo *t, const char *name);
/* The node of netdev ifname under root (-1 when none): for the tcp provider. */
int numa_netdev_node(const char *root, const char *ifname);

/* Can memory and threads be placed at all? false with *why when libnuma is unavailable at run time
 * or the machine has one node. */
bool numa_usable(const struct numa_topo *t, bool libnuma_ok, const char **why);
/* The home node: where the data-path thread runs and rings go by default, or -1 (unplaced) with
 * *why saying why. mode: NUMA_AUTO, NUMA_OFF or a node; dev_node: the device's node. */
int numa_home(const struct numa_topo *t, bool usable, int mode, int dev_node, const char **why);
/* A channel's node: the application's hint when it names an online node, else home. -EINVAL when the
 * hint names no online node (hint < 0: no hint). */
int numa_channel_node(const struct numa_topo *t, bool usable, int home, int hint);
/* With several devices (rails): the rail whose device sits on node want (the hint, else the
 * connecting thread's node), else rail 0. rail_node[r]: node of rail r's device, -1 none. */
unsigned numa_rail_pick(const int *rail_node, unsigned n_rails, int want);
/* Where a channel on a device of node dev_node puts its rings: the hint (as numa_channel_node),
 * else the device's node when meshd places by device (numa = auto), else home. */
int numa_ring_node(const struct numa_topo *t, bool usable, bool by_device, int home, int dev_node, int hint);

/* Run-time side (libnuma). numa_lib_ok: numa_available() >= 0. */
bool numa_lib_ok(void);
/* Binds [addr, addr+len) to node, preferred (an allocation elsewhere beats a failure), then faults
 * every page in so the policy decides now, before any registration pins them. node < 0: faults in
 * only. 0 or a negative errno. */
int numa_place(void *addr, size_t len, int node);
/* The node holding the page at addr (-1 when unknown). */
int numa_page_node(const void *addr);
/* The node of the pages at the given addresses when they agree, -2 when they differ, -1 unknown. */
int numa_pages_node(const void *const *addrs, size_t n);

#endif
