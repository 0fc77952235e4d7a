/*
 * Reload (SIGHUP, `meshctl reload`; daemon.h): the configuration file read again and applied, or
 * refused as a whole (docs/design.md, "Reload"), and the cluster key loaded from its file.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "check.h"
#include "daemon.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "metrics_http.h"
#include "transport.h"
#include "util.h"

/* cluster.key_file, relative to the configuration file's directory; "" loads nothing. */
/* 0 (the keys, or none without key_file), or an error written into err. */
int load_keys(const struct mesh_config *cfg, const char *cfg_path, struct auth_keys *keys, char *err,
		     size_t errlen)
{
	char path[PATH_MAX];
	int ret;

	memset(keys, 0, sizeof(*keys));
	if (!cfg->key_file[0])
		return 0;
	if (check_key_path(cfg, cfg_path, path, sizeof(path))) {
		snprintf(err, errlen, "cluster.key_file %s: the path is too long", cfg->key_file);
		return -ENAMETOOLONG;
	}
	ret = auth_load_keys(path, keys, err, errlen);
	if (!ret)
		log_info("cluster key from %s (%u key%s)", path, keys->n, keys->n > 1 ? "s: current and next" : "");
	return ret;
}

/* Takes a reload's outcome into what `meshctl node` and the metrics show, and tells systemd. */
static void reload_done(struct daemon *d, int ret, const char *err)
{
	struct mesh_conf_state *c = &d->mesh.conf;

	if (ret) {
		c->refused++;
		util_strlcpy(c->error, err, sizeof(c->error));
	} else {
		c->reloads++;
		c->generation++;
		c->loaded_us = util_wall_us();
		c->error[0] = '\0';
	}
	notify_status(d, "READY=1\n");
}

/* The providers' lists of the other nodes' addresses (xport_attr.node_addrs), after a reload. */
static void xports_node_addrs(struct daemon *d, const struct config_node *self)
{
	uint32_t n;
	const char **addrs = node_addrs_list(d, self, &n);

	for (size_t i = 0; addrs && i < d->n_xports; i++)
		if (xport_set_node_addrs(d->xports[i], addrs, n))
			addrs = NULL;
	if (!addrs)
		log_warn("reload: no memory for the nodes' addresses: the transports keep the old list");
	free(addrs);
}

/* The new metrics address in the other slot, before the old one is given up; 0, or err said. */
static int reload_metrics_open(struct daemon *d, const char *listen, struct metrics_http **out, char *err,
			       size_t errlen)
{
	struct metrics_http *o = &d->metrics_slot[d->metrics == &d->metrics_slot[0]];
	int ret;

	memset(o, 0, sizeof(*o));
	o->fd = -1;
	ret = metrics_http_open(o, listen, &d->admin);
	if (!ret && o->fd >= 0 && (ret = add_fd(d->epfd, o->fd, TAG(TAG_METRICS))))
		metrics_http_close(o);
	if (ret)
		snprintf(err, errlen, "metrics_listen \"%s\": cannot serve there (%s)", listen, mesh_strerror(ret));
	*out = o;
	return ret;
}

/*
 * Reads the configuration file again and applies what changed, with every lock held: from SIGHUP
 * or `meshctl reload` (how says which). A file that does not load, a key only a start applies that
 * changed (config_reload_check), a key file that does not load or a metrics address that cannot be
 * served refuses the whole reload: meshd keeps what it had and err says why. Otherwise the links
 * follow the nodes (mesh_reconfigure: only those added, removed or moved are touched), new keys
 * serve the next handshakes (links already proven stay), and limits, timeouts, the log level and
 * the metrics address apply from now on. 0 or a negative errno.
 */
int daemon_reload(void *ctx, const char *how, char *err, size_t errlen)
{
	struct daemon *d = ctx;
	struct mesh_config nc = {0}, old;
	const struct config_node *self;
	struct metrics_http *mh = NULL;
	struct auth_keys keys = {0};
	struct mesh_reconf rc;
	const char *listen;
	char why[448];
	int ret;

	notify("RELOADING=1\nSTATUS=reloading the configuration");
	log_info("reloading %s (%s)", d->cfg_path, how);
	ret = config_load(d->cfg_path, &nc, err, errlen);
	if (!ret && (ret = config_reload_check(&d->cfg, &nc, d->self_id, why, sizeof(why))))
		snprintf(err, errlen, "%s: %s", d->cfg_path, why);
	if (!ret)
		ret = load_keys(&nc, d->cfg_path, &keys, err, errlen);
	self = ret ? NULL : config_node_find(&nc, d->self_id);
	listen = self ? config_node_metrics_listen(&nc, self) : "";
	if (!ret && strcmp(listen, config_node_metrics_listen(&d->cfg, d->mesh.self)))
		ret = reload_metrics_open(d, listen, &mh, err, errlen);
	if (ret) {
		log_error("reload refused, nothing was changed: %s", err);
		config_free(&nc);
		explicit_bzero(&keys, sizeof(keys));
		reload_done(d, ret, err);
		return ret;
	}
	old = d->cfg;
	d->cfg = nc; /* where m->cfg points */
	self = config_node_find(&d->cfg, d->self_id);
	mesh_reconfigure(&d->mesh, self, &rc);
	xports_node_addrs(d, self);
	explicit_bzero(&d->mesh.keys, sizeof(d->mesh.keys));
	d->mesh.keys = keys;
	explicit_bzero(&keys, sizeof(keys));
	if (!d->level_override)
		log_set_level((enum log_level)log_level_parse(d->cfg.log_level));
	if (d->cfg.keepalive_interval_ms != old.keepalive_interval_ms) {
		d->tick_period_ms = MAX(5u, MIN(100u, d->cfg.keepalive_interval_ms / 4));
		timer_set(d->tfd, d->tick_period_ms);
	}
	if (mh) {
		if (d->metrics->fd >= 0)
			epoll_ctl(d->epfd, EPOLL_CTL_DEL, d->metrics->fd, NULL);
		metrics_http_close(d->metrics);
		d->metrics = mh;
		log_info("metrics: %s%s", listen[0] ? "serving at " : "no longer served", listen);
	}
	config_free(&old);
	reload_done(d, 0, "");
	log_info("configuration reloaded (generation %llu): %u node(s) added, %u removed, %u moved; %zu peers",
		 (unsigned long long)d->mesh.conf.generation, rc.added, rc.removed, rc.moved, d->mesh.n_links);
	return 0;
}
