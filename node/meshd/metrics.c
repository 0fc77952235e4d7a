/*
 * The renderers of metrics.h: every metric of the node in the Prometheus text format
 * (metrics_render) and the health of /healthz (metrics_health_render), read from the mesh, its
 * links and channels. They write into metrics_buf.c's buffer and take the reasons and the
 * round-trip buckets from metrics_count.c; nothing below calls back into this file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "mesh.h"
#include "metrics.h"
#include "util.h"

/* ---- the renderer ---- */

static void family(struct metrics_buf *b, const char *name, const char *type, const char *help)
{
	metrics_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample of a node-wide family without labels. */
static void node_sample(struct metrics_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
	family(b, name, type, help);
	metrics_buf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A per-link sample: name{peer="N"<more>} value. */
static void link_sample(struct metrics_buf *b, const char *name, const struct link *l, const char *more, uint64_t v)
{
	metrics_buf_printf(b, "%s{peer=\"%u\"%s} %llu\n", name, l->peer->id, more, (unsigned long long)v);
}

/* Registered memory by provider: a few names, one slot each. */
struct mem_by_xport {
	const char *name[MESH_XPORTS_MAX + 1];
	uint64_t bytes[MESH_XPORTS_MAX + 1];
};

static void mem_add(struct mem_by_xport *mx, const xport_mr_t *mr)
{
	const char *name;
	size_t i;

	if (!mr)
		return;
	name = mr->xport ? xport_name(mr->xport) : "unknown";
	for (i = 0; i < ARRAY_SIZE(mx->name) && mx->name[i] && strcmp(mx->name[i], name); i++)
		;
	if (i == ARRAY_SIZE(mx->name))
		i--; /* more providers than built in: never, but counted somewhere */
	mx->name[i] = name;
	mx->bytes[i] += mr->len;
}

static void render_node(const struct mesh *m, const struct metrics_extra *x, struct metrics_buf *b)
{
	static const char *const ch_states[] = {"OPENING", "OPEN", "HALF_CLOSED", "RESUMING", "CLOSING", "ERROR"};
	uint64_t ch_count[ARRAY_SIZE(ch_states)] = {0};
	struct mem_by_xport mx;
	char version[32];

	memset(&mx, 0, sizeof(mx));
	snprintf(version, sizeof(version), "%d.%d", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
	family(b, "rdmamesh_node_info", "gauge", "This meshd: its node id, cluster name and version (always 1).");
	metrics_buf_printf(b, "rdmamesh_node_info{node=\"%u\",cluster=\"", m->self->id);
	metrics_buf_label_value(b, m->cfg->cluster_name);
	metrics_buf_printf(b, "\",version=\"%s\"} 1\n", version);
	family(b, "rdmamesh_start_time_seconds", "gauge", "When this meshd started, seconds since the epoch.");
	metrics_buf_printf(b, "rdmamesh_start_time_seconds %.6f\n", (double)m->boot_epoch / 1e6);
	/* As Prometheus's own prometheus_config_last_reload_successful and its timestamp. */
	node_sample(b, "rdmamesh_config_generation", "gauge",
		    "The configuration in force: 1 at start, one more per reload applied.", m->conf.generation);
	node_sample(b, "rdmamesh_config_last_reload_successful", "gauge",
		    "0 when the last reload was refused (meshctl node: config_error says why), else 1.",
		    m->conf.error[0] == '\0');
	family(b, "rdmamesh_config_last_reload_success_timestamp_seconds", "gauge",
	       "When the configuration in force was loaded, seconds since the epoch.");
	metrics_buf_printf(b, "rdmamesh_config_last_reload_success_timestamp_seconds %.6f\n",
			   (double)m->conf.loaded_us / 1e6);
	family(b, "rdmamesh_config_reloads_total", "counter", "Reloads (SIGHUP, meshctl reload), applied or refused.");
	metrics_buf_printf(b, "rdmamesh_config_reloads_total{result=\"applied\"} %llu\n",
			   (unsigned long long)m->conf.reloads);
	metrics_buf_printf(b, "rdmamesh_config_reloads_total{result=\"refused\"} %llu\n",
			   (unsigned long long)m->conf.refused);
	node_sample(b, "rdmamesh_peers", "gauge", "Peers configured (one link each).", m->n_links);
	node_sample(b, "rdmamesh_links_up", "gauge", "Links UP.", mesh_links_up(m));
	node_sample(b, "rdmamesh_handshakes_in_flight", "gauge", "Link attempts in their handshake now.", m->handshakes);
	node_sample(b, "rdmamesh_dial_window", "gauge",
		    "Our dials allowed in flight now (adaptive admission, at most cluster.max_handshakes).",
		    mesh_dial_window(m));
	node_sample(b, "rdmamesh_admission_cuts_total", "counter",
		    "Times the dial window was halved: attempts timed out or peers answered busy.", m->adm.cuts);
	node_sample(b, "rdmamesh_peer_rejects_total", "counter",
		    "Connection requests refused (bad private data, busy, stale, unproven).", m->peer_rejects);
	node_sample(b, "rdmamesh_link_flaps_total", "counter", "UP links that went DOWN.", m->link_flaps);
	node_sample(b, "rdmamesh_rail_failovers_total", "counter",
		    "Rails that failed while their link stayed UP on the others.", m->rail_failovers);
	node_sample(b, "rdmamesh_channel_resumes_total", "counter",
		    "Channels that resumed after their link or rail came back.", m->channel_resumes);
	node_sample(b, "rdmamesh_control_errors_total", "counter",
		    "Undecodable or invalid requests on the local control socket.", x ? x->ctl_errors : 0);
	node_sample(b, "rdmamesh_metrics_scrapes_total", "counter", "Requests for /metrics over HTTP.",
		    x ? x->http_scrapes : 0);
	node_sample(b, "rdmamesh_metrics_renders_total", "counter",
		    "Times the HTTP endpoint rendered this text (what a flood of scrapes costs meshd).",
		    x ? x->http_renders : 0);

	for (const struct channel *ch = m->chans->channels; ch; ch = ch->next) {
		const char *s = channel_state_name(ch);

		for (size_t i = 0; i < ARRAY_SIZE(ch_states); i++)
			if (!strcmp(s, ch_states[i]))
				ch_count[i]++;
		mem_add(&mx, ch->mr_tx);
		mem_add(&mx, ch->mr_rx);
		mem_add(&mx, ch->mr_cin);
		mem_add(&mx, ch->mr_cout);
	}
	family(b, "rdmamesh_channels", "gauge", "Channels of local applications, by state.");
	for (size_t i = 0; i < ARRAY_SIZE(ch_states); i++)
		metrics_buf_printf(b, "rdmamesh_channels{state=\"%s\"} %llu\n", ch_states[i], (unsigned long long)ch_count[i]);
	{
		uint64_t ports = 0;

		for (const struct listener *li = m->chans->listeners; li; li = li->next)
			ports++;
		node_sample(b, "rdmamesh_listening_ports", "gauge", "Ports local applications listen on.", ports);
	}

	for (size_t i = 0; i < m->n_links; i++) {
		const struct link *l = m->links[i];

		mem_add(&mx, l->mr_local);
		mem_add(&mx, l->mr_mailbox);
		for (uint32_t r = 1; r < MESH_RAILS_MAX; r++)
			mem_add(&mx, l->mr_rails[r]);
	}
	for (size_t i = 0; i < m->grave.n_mrs; i++)
		mem_add(&mx, m->grave.mrs[i]);
	for (size_t i = 0; i < m->n_xports; i++)
		mem_add(&mx, &(xport_mr_t){.xport = m->xports[i * m->n_rails]}); /* every provider shows, 0 or not */
	family(b, "rdmamesh_memory_registered_bytes", "gauge",
	       "Memory registered with the providers (pinned for RDMA): link buffers, mailboxes and channel rings.");
	for (size_t i = 0; i < ARRAY_SIZE(mx.name) && mx.name[i]; i++)
		metrics_buf_printf(b, "rdmamesh_memory_registered_bytes{transport=\"%s\"} %llu\n", mx.name[i],
				   (unsigned long long)mx.bytes[i]);
}

/* The histogram of rail r's keepalive round trips: cumulative buckets, +Inf equal to _count. */
static void rtt_histogram(struct metrics_buf *b, const struct link *l, uint32_t r)
{
	const struct metrics_rtt *h = &l->metrics.rtt[r];
	uint64_t cum = 0;

	for (uint32_t k = 0; k < METRICS_RTT_BUCKETS; k++) {
		cum += h->n[k];
		metrics_buf_printf(b, "rdmamesh_link_rtt_seconds_bucket{peer=\"%u\",rail=\"%u\",le=\"%g\"} %llu\n",
				   l->peer->id, r, (double)metrics_rtt_bounds_us[k] / 1e6, (unsigned long long)cum);
	}
	cum += h->n[METRICS_RTT_BUCKETS];
	metrics_buf_printf(b, "rdmamesh_link_rtt_seconds_bucket{peer=\"%u\",rail=\"%u\",le=\"+Inf\"} %llu\n",
			   l->peer->id, r, (unsigned long long)cum);
	metrics_buf_printf(b, "rdmamesh_link_rtt_seconds_sum{peer=\"%u\",rail=\"%u\"} %.6f\n", l->peer->id, r,
			   (double)h->sum_us / 1e6);
	metrics_buf_printf(b, "rdmamesh_link_rtt_seconds_count{peer=\"%u\",rail=\"%u\"} %llu\n", l->peer->id, r,
			   (unsigned long long)cum);
}

static void render_links(const struct mesh *m, struct metrics_buf *b)
{
	static const char *const states[] = {"DOWN", "CONNECTING", "UP"};
	uint32_t *open = calloc(m->n_links ? m->n_links : 1, sizeof(*open));
	char more[64];

	if (!open) {
		b->oom = true;
		return;
	}
	for (const struct channel *ch = m->chans->channels; ch; ch = ch->next)
		if (ch->link && ch->state == CH_OPEN) {
			size_t k = mesh_link_index(m, ch->link); /* the local node's is not one of them */

			if (k < m->n_links)
				open[k]++;
		}

	family(b, "rdmamesh_link_info", "gauge", "A configured peer: its address and the provider of its link (always 1).");
	for (size_t i = 0; i < m->n_links; i++) {
		const struct link *l = m->links[i];

		metrics_buf_printf(b, "rdmamesh_link_info{peer=\"%u\",addr=\"", l->peer->id);
		metrics_buf_label_value(b, l->peer->addr);
		metrics_buf_printf(b, "\",transport=\"%s\"} 1\n", link_transport(l));
	}
	family(b, "rdmamesh_link_up", "gauge", "1 when the link to the peer is UP, else 0.");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_up", m->links[i], "", link_state(m->links[i]) == LINK_STATE_UP_);
	family(b, "rdmamesh_link_state", "gauge", "The link's state: 1 for the one it is in (DOWN, CONNECTING, UP).");
	for (size_t i = 0; i < m->n_links; i++)
		for (size_t s = 0; s < ARRAY_SIZE(states); s++) {
			snprintf(more, sizeof(more), ",state=\"%s\"", states[s]);
			link_sample(b, "rdmamesh_link_state", m->links[i], more, link_state(m->links[i]) == s);
		}
	family(b, "rdmamesh_link_rail_up", "gauge", "1 when the rail of the link carries traffic, else 0.");
	for (size_t i = 0; i < m->n_links; i++)
		for (uint32_t r = 0; r < m->n_rails; r++) {
			snprintf(more, sizeof(more), ",rail=\"%u\"", r);
			link_sample(b, "rdmamesh_link_rail_up", m->links[i], more,
				    m->links[i]->phase == LINK_UP && mesh_link_rail_up(m->links[i], r));
		}
	/* The gauge was rdmamesh_link_rtt_seconds{peer} until that name became the histogram's. */
	family(b, "rdmamesh_link_last_rtt_seconds", "gauge",
	       "Round-trip time of the last keepalive on the link's control rail (UP links that measured one).");
	for (size_t i = 0; i < m->n_links; i++)
		if (m->links[i]->phase == LINK_UP && m->links[i]->rtt_us)
			metrics_buf_printf(b, "rdmamesh_link_last_rtt_seconds{peer=\"%u\"} %.6f\n", m->links[i]->peer->id,
					   (double)m->links[i]->rtt_us / 1e6);
	family(b, "rdmamesh_link_rtt_seconds", "histogram",
	       "Round-trip times of the keepalives on each rail of the link: one sample per keepalive acked.");
	for (size_t i = 0; i < m->n_links; i++)
		for (uint32_t r = 0; r < m->n_rails; r++)
			rtt_histogram(b, m->links[i], r);
	family(b, "rdmamesh_link_ups_total", "counter", "Times the link came UP.");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_ups_total", m->links[i], "", m->links[i]->ups);
	family(b, "rdmamesh_link_downs_total", "counter",
	       "Times the UP link went DOWN, by reason (every reason, 0 before its first time).");
	for (size_t i = 0; i < m->n_links; i++)
		for (int r = 0; r < METRICS_REASONS; r++) {
			snprintf(more, sizeof(more), ",reason=\"%s\"", metrics_reason_name((enum metrics_reason)r));
			link_sample(b, "rdmamesh_link_downs_total", m->links[i], more, m->links[i]->metrics.downs[r]);
		}
	family(b, "rdmamesh_link_handshake_failures_total", "counter",
	       "Link attempts that ended before UP, by reason (every reason, 0 before its first time).");
	for (size_t i = 0; i < m->n_links; i++)
		for (int r = 0; r < METRICS_REASONS; r++) {
			snprintf(more, sizeof(more), ",reason=\"%s\"", metrics_reason_name((enum metrics_reason)r));
			link_sample(b, "rdmamesh_link_handshake_failures_total", m->links[i], more,
				    m->links[i]->metrics.hs_failures[r]);
		}
	family(b, "rdmamesh_link_keepalive_misses_total", "counter",
	       "Keepalives on the rail whose ack had not come back when the next one was due.");
	for (size_t i = 0; i < m->n_links; i++)
		for (uint32_t r = 0; r < m->n_rails; r++) {
			snprintf(more, sizeof(more), ",rail=\"%u\"", r);
			link_sample(b, "rdmamesh_link_keepalive_misses_total", m->links[i], more,
				    m->links[i]->metrics.ka_misses[r]);
		}
	family(b, "rdmamesh_link_rail_failovers_total", "counter", "Rails of the link that failed while it stayed UP.");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_rail_failovers_total", m->links[i], "", m->links[i]->rail_failovers);
	family(b, "rdmamesh_link_control_messages_total", "counter", "Control messages over the link, by direction.");
	for (size_t i = 0; i < m->n_links; i++) {
		link_sample(b, "rdmamesh_link_control_messages_total", m->links[i], ",direction=\"tx\"", m->links[i]->tx_msgs);
		link_sample(b, "rdmamesh_link_control_messages_total", m->links[i], ",direction=\"rx\"", m->links[i]->rx_msgs);
	}
	family(b, "rdmamesh_link_bytes_total", "counter", "Channel payload bytes over the link, by direction.");
	for (size_t i = 0; i < m->n_links; i++) {
		link_sample(b, "rdmamesh_link_bytes_total", m->links[i], ",direction=\"tx\"", m->links[i]->metrics.tx_bytes);
		link_sample(b, "rdmamesh_link_bytes_total", m->links[i], ",direction=\"rx\"", m->links[i]->metrics.rx_bytes);
	}
	family(b, "rdmamesh_link_chunks_total", "counter",
	       "Channel chunks over the link, by direction: writes meshd posted, or batches of an application's own "
	       "writes meshd accounted (cluster.app_send).");
	for (size_t i = 0; i < m->n_links; i++) {
		link_sample(b, "rdmamesh_link_chunks_total", m->links[i], ",direction=\"tx\"", m->links[i]->metrics.tx_chunks);
		link_sample(b, "rdmamesh_link_chunks_total", m->links[i], ",direction=\"rx\"", m->links[i]->metrics.rx_chunks);
	}
	family(b, "rdmamesh_link_credit_stalls_total", "counter",
	       "Times a channel over the link waited for the peer's reader (a whole ring unconsumed).");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_credit_stalls_total", m->links[i], "", m->links[i]->metrics.credit_stalls);
	family(b, "rdmamesh_link_channel_resumes_total", "counter",
	       "Channels over the link that resumed after it (or their rail) came back.");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_channel_resumes_total", m->links[i], "", m->links[i]->metrics.channel_resumes);
	family(b, "rdmamesh_link_channels_opened_total", "counter",
	       "Channels that opened over the link, asked for by either side.");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_channels_opened_total", m->links[i], "", m->links[i]->metrics.channels_opened);
	family(b, "rdmamesh_link_app_grants_total", "counter",
	       "Times one of our applications took over its channel's sending half (cluster.app_send: its own "
	       "QP, or over tcp its own connection).");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_app_grants_total", m->links[i], "", m->links[i]->metrics.app_grants);
	family(b, "rdmamesh_link_channels_open", "gauge", "Open channels over the link (resuming and half-closed ones too).");
	for (size_t i = 0; i < m->n_links; i++)
		link_sample(b, "rdmamesh_link_channels_open", m->links[i], "", open[i]);
	free(open);
}

int metrics_health_render(const struct mesh *m, struct metrics_buf *b)
{
	uint32_t down = 0;

	for (size_t i = 0; i < m->n_links; i++)
		down += link_state(m->links[i]) != LINK_STATE_UP_;
	if (!down) {
		metrics_buf_printf(b, "ok\n");
		return b->oom ? -ENOMEM : 0;
	}
	metrics_buf_printf(b, "%u of %zu links not UP\n", down, m->n_links);
	for (size_t i = 0; i < m->n_links; i++) {
		const struct link *l = m->links[i];
		size_t from = b->len;

		if (link_state(l) == LINK_STATE_UP_)
			continue;
		metrics_buf_printf(b, "peer %u %s: %s", l->peer->id, link_state_name(link_state(l)),
				   l->last_error[0] ? l->last_error : "no attempt ended yet");
		for (size_t k = from; k < b->len && !b->oom; k++) /* one line per link, whatever the error says */
			if ((unsigned char)b->s[k] < 0x20)
				b->s[k] = ' ';
		metrics_buf_printf(b, "\n");
	}
	return b->oom ? -ENOMEM : (int)down; /* links are at most 65536 */
}

int metrics_render(const struct mesh *m, const struct metrics_extra *x, struct metrics_buf *b)
{
	render_node(m, x, b);
	metrics_render_process(b);
	render_links(m, b);
	return b->oom ? -ENOMEM : 0;
}
