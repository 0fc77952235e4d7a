/*
 * What each object prints: the field tables of links, channels, ports, the node and its devices and
 * data-path threads (one row per field: JSON key, table column or JSON only, width, kind, member),
 * and the renderers that lay them out through out.c. A table's columns are in the order of its rows;
 * the JSON of `meshctl -j links` is a stable interface.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "meshctl.h"
#include "util.h"

#define LF(key, table, width, kind, member) {key, table, width, kind, offsetof(LinkInfo, member), false}
#define LW(key, table, width, kind, member) {key, table, width, kind, offsetof(LinkInfo, member), true}
static const struct field link_fields[] = {
	LF("peer", true, 5, F_U32, peer),
	LF("addr", true, -15, F_STR, peer_addr),
	LF("port", true, 5, F_U32, peer_port),
	LF("state", true, -10, F_STATE, state),
	LF("dialer", true, -6, F_BOOL, dialer),
	LF("qps", true, 3, F_U32, qps),
	LF("qps_configured", false, 0, F_U32, qps_configured),
	LF("rails_up", true, 8, F_U32, rails_up),
	LF("rails", false, 0, F_U32, rails),
	LF("rail_failovers", false, 0, F_U64, rail_failovers),
	LF("ctl_rail", false, 0, F_U32, ctl_rail),
	LF("rail_error", false, 0, F_STR, rail_error),
	LW("epoch", true, 16, F_U64, epoch),
	LF("rtt_us", true, 6, F_U64, rtt_us),
	LW("mailbox", true, -30, F_MAILBOX, mailbox),
	LW("transport", true, -9, F_STR, transport),
	LF("state_ms", true, 8, F_DURATION_MS, state_ms),
	LF("ups", true, 4, F_U32, ups),
	LF("attempts", false, 0, F_U32, attempts),
	LF("peer_boot_epoch", false, 0, F_U64, peer_boot_epoch),
	LF("tx_msgs", false, 0, F_U64, tx_msgs),
	LF("rx_msgs", false, 0, F_U64, rx_msgs),
	LF("down_error", false, 0, F_STR, down_error),
	LF("last_error", true, -1, F_STR, last_error),
};

#define CF(key, table, width, kind, member) {key, table, width, kind, offsetof(ChannelInfo, member), false}
#define CW(key, table, width, kind, member) {key, table, width, kind, offsetof(ChannelInfo, member), true}
static const struct field channel_fields[] = {
	CF("id", true, 5, F_U32, id),
	CF("local_node", false, 0, F_U32, local_node),
	CF("local_port", true, 10, F_U32, local_port),
	CF("peer_node", true, 9, F_U32, peer_node),
	CF("peer_port", true, 9, F_U32, peer_port),
	CF("opener", true, -6, F_BOOL, opener),
	CW("owner_uid", true, 9, F_U32, owner_uid),
	CF("state", true, -11, F_STR, state),
	CW("qps", true, 3, F_U32, qps),
	CF("rail", true, 4, F_U32, rail),
	CW("device", true, -8, F_STR, device),
	CW("ring_size", true, 9, F_U64, ring_size),
	CF("tx_bytes", true, 10, F_U64, tx_bytes),
	CF("rx_bytes", true, 10, F_U64, rx_bytes),
	CW("tx_chunks", true, 9, F_U64, tx_chunks),
	CW("rx_chunks", true, 9, F_U64, rx_chunks),
	CW("in_flight", true, 9, F_U32, in_flight),
	CW("credit_stalls", true, 13, F_U64, credit_stalls),
	CW("resumes", true, 7, F_U64, resumes),
	CW("rewritten_bytes", true, 15, F_U64, rewritten_bytes),
	CF("rail_moves", false, 0, F_U64, rail_moves),
	CF("direct_writes", false, 0, F_U64, direct_writes),
	CF("direct_paused", false, 0, F_BOOL, direct_paused),
	CF("pair_hints", false, 0, F_U64, pair_hints),
	CF("writer", false, 0, F_STR, writer),
	CF("peer_app_writes", false, 0, F_BOOL, peer_app_writes),
	CF("app_grants", false, 0, F_U64, app_grants),
	CF("app_withdrawn", false, 0, F_U64, app_withdrawn),
	CW("numa_node", true, 9, F_NODE, numa_node),
	CF("numa_want", false, 0, F_NODE, numa_want),
	CF("tx_pending", false, 0, F_U64, tx_pending),
	CF("rx_unread", false, 0, F_U64, rx_unread),
	CF("error", true, -1, F_STR, error),
};

#define NF(key, kind, member) {key, true, 0, kind, offsetof(NodeInfo, member), false}
static const struct field node_fields[] = {
	NF("id", F_U32, id),
	NF("cluster", F_STR, cluster),
	NF("cluster_hash", F_U32, cluster_hash),
	NF("addr", F_STR, addr),
	NF("port", F_U32, port),
	NF("transport", F_STR, transport),
	NF("qps_per_link", F_U32, qps_per_link),
	NF("peers", F_U32, peers),
	NF("links_up", F_U32, links_up),
	NF("boot_epoch", F_U64, boot_epoch),
	NF("uptime_ms", F_U64, uptime_ms),
	NF("pid", F_U32, pid),
	NF("version", F_STR, version),
	NF("ctl_errors", F_U64, ctl_errors),
	NF("peer_rejects", F_U64, peer_rejects),
	NF("link_flaps", F_U64, link_flaps),
	NF("channel_resumes", F_U64, channel_resumes),
	NF("rail_failovers", F_U64, rail_failovers),
	NF("handshakes", F_U32, handshakes),
	NF("dial_window", F_U32, dial_window),
	NF("handshake_ms", F_U64, handshake_ms),
	NF("admission_cuts", F_U64, admission_cuts),
	NF("from_snapshot", F_BOOL, from_snapshot),
	NF("snapshot_age_ms", F_U64, snapshot_age_ms),
	NF("snapshot_replies", F_U64, snapshot_replies),
	NF("queued_replies", F_U64, queued_replies),
	NF("ctl_priority", F_U32, ctl_priority),
	NF("ctl_demotions", F_U64, ctl_demotions),
	NF("ctl_tid", F_U32, ctl_tid),
	NF("numa", F_STR, numa),
	NF("numa_usable", F_BOOL, numa_usable),
	NF("numa_nodes", F_U32, numa_nodes),
	NF("numa_home", F_NODE, numa_home),
	NF("numa_why", F_STR, numa_why),
	NF("config_path", F_STR, config_path),
	NF("config_generation", F_U64, config_generation),
	NF("config_loaded_us", F_WALL_US, config_loaded_us),
	NF("config_reloads", F_U64, config_reloads),
	NF("config_refused", F_U64, config_refused),
	NF("config_error", F_STR, config_error),
	NF("log_level", F_STR, log_level),
	NF("draining", F_BOOL, draining),
	NF("drain_left_ms", F_U64, drain_left_ms),
	NF("channels", F_U32, channels),
	NF("fd_store", F_BOOL, fd_store),
	NF("channels_kept", F_U32, channels_kept),
	NF("predecessor_epoch", F_U64, predecessor_epoch),
};

#define DF(key, table, width, kind, member) {key, table, width, kind, offsetof(NumaDevice, member), false}
static const struct field device_fields[] = {
	DF("name", true, -10, F_STR, name),
	DF("provider", true, -8, F_STR, provider),
	DF("rail", true, 4, F_U32, rail),
	DF("address", true, -16, F_STR, address),
	DF("numa_node", true, 9, F_NODE, numa_node),
	DF("cpus", true, -12, F_STR, cpus),
	DF("netdev", true, -1, F_STR, netdev),
};

#define TF(key, table, width, kind, member) {key, table, width, kind, offsetof(DataPathThread, member), false}
#define TW(key, table, width, kind, member) {key, table, width, kind, offsetof(DataPathThread, member), true}
static const struct field thread_fields[] = {
	TF("name", true, -15, F_STR, name),
	TF("tid", true, 7, F_U32, tid),
	TF("rail", true, 4, F_U32, rail),
	TF("devices", true, -10, F_STR, devices),
	TF("numa_node", true, 9, F_NODE, numa_node),
	TF("cpus", true, -12, F_STR, cpus),
	TF("polling", true, -8, F_STR, polling),
	TW("poll_budget_us", true, 14, F_U32, poll_budget_us),
	TF("fast_events", true, 11, F_U64, fast_events),
	TW("deferred_events", true, 15, F_U64, deferred_events),
	TW("slow_sections", true, 13, F_U64, slow_sections),
	TF("kicks", true, -1, F_U64, kicks),
};

/* The rows of one peer (o->peer, meshctl links 2), in place; all of them without. */
static size_t peer_rows(const struct out *o, void **rows, size_t n, bool links)
{
	size_t k = 0;

	if (o->peer < 0)
		return n;
	for (size_t i = 0; i < n; i++) {
		uint32_t peer = links ? ((const LinkInfo *)rows[i])->peer : ((const ChannelInfo *)rows[i])->peer_node;

		if (peer == (uint32_t)o->peer)
			rows[k++] = rows[i];
	}
	return k;
}

void print_channels(struct out *o, const CtlReply *r)
{
	char title[160];
	size_t n = peer_rows(o, (void **)r->channels, r->n_channels, false);

	snprintf(title, sizeof(title), "node %" PRIu32 " (%s): %zu channel%s%s", r->node ? r->node->id : 0,
		 r->node ? r->node->cluster : "", n, n == 1 ? "" : "s", o->peer >= 0 ? " with that peer" : "");
	print_list(o, r, "channels", channel_fields, ARRAY_SIZE(channel_fields), (void *const *)r->channels, n, title);
}

#define PF(key, table, width, kind, member) {key, table, width, kind, offsetof(PortInfo, member), false}
static const struct field port_fields[] = {
	PF("port", true, 5, F_U32, port),
	PF("owner_uid", true, 9, F_U32, owner_uid),
	PF("owner_pid", true, 9, F_I32, owner_pid),
	PF("channels", true, 8, F_U32, channels),
};

void print_ports(struct out *o, const CtlReply *r)
{
	char title[160];

	snprintf(title, sizeof(title), "node %" PRIu32 " (%s): %zu listening port%s", r->node ? r->node->id : 0,
		 r->node ? r->node->cluster : "", r->n_ports, r->n_ports == 1 ? "" : "s");
	print_list(o, r, "ports", port_fields, ARRAY_SIZE(port_fields), (void *const *)r->ports, r->n_ports, title);
}

void print_links(struct out *o, const CtlReply *r)
{
	char title[160];

	snprintf(title, sizeof(title), "node %" PRIu32 " (%s) links: %" PRIu32 " of %" PRIu32 " UP",
		 r->node ? r->node->id : 0, r->node ? r->node->cluster : "", r->node ? r->node->links_up : 0,
		 r->node ? r->node->peers : 0);
	print_list(o, r, "links", link_fields, ARRAY_SIZE(link_fields), (void *const *)r->links,
		   peer_rows(o, (void **)r->links, r->n_links, true), title);
}

void print_node(struct out *o, const CtlReply *r)
{
	if (!r->node)
		return;
	const NodeInfo *n = r->node;

	if (o->json) {
		json_open(o, NULL, '{');
		for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++)
			field_print(o, &node_fields[f], n, false);
		print_rows(o, "devices", device_fields, ARRAY_SIZE(device_fields), (void *const *)n->devices, n->n_devices);
		print_rows(o, "threads", thread_fields, ARRAY_SIZE(thread_fields), (void *const *)n->threads, n->n_threads);
		json_close(o, '}');
		putchar('\n');
		return;
	}
	for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++) {
		printf("%-14s ", node_fields[f].key);
		field_print(o, &node_fields[f], n, true);
		putchar('\n');
	}
	if (n->n_devices) {
		putchar('\n');
		print_rows(o, NULL, device_fields, ARRAY_SIZE(device_fields), (void *const *)n->devices, n->n_devices);
	}
	if (n->n_threads) {
		putchar('\n');
		print_rows(o, NULL, thread_fields, ARRAY_SIZE(thread_fields), (void *const *)n->threads, n->n_threads);
	}
}

/* The node's fields that want() picks, as JSON members in the table's order (reload: its
 * configuration's, drain: its channels and time left). */
void print_node_members(struct out *o, const NodeInfo *n, bool (*want)(const char *key))
{
	for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++)
		if (want(node_fields[f].key))
			field_print(o, &node_fields[f], n, false);
}
