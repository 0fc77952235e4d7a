/*
 * meshd and its service manager (sd_notify(3)): READY=1 once the listeners and the control socket
 * serve, STATUS= with the links UP, WATCHDOG=1 from the tick, RELOADING=1 and STOPPING=1; and its
 * descriptor store (FDSTORE=1, LISTEN_FDS), where channels are kept across a restart
 * (channel_store.c). libsystemd is opened only when $NOTIFY_SOCKET names a manager's socket.
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
#include "channel.h"
#include "check.h"
#include "daemon.h"
#include "config.h"
#include "log.h"
#include "mesh.h"
#include "metrics_http.h"
#include "transport.h"
#include "util.h"

/* libsystemd's sd_notify(3), loaded only when $NOTIFY_SOCKET names a service manager's socket
 * (systemd's Type=notify sets it): linked, libsystemd mapped itself and six compression and crypto
 * libraries into every meshd, a run by hand or in a test included, which was a tenth of meshd's start
 * where 64 start at once (docs/design.md, "Formation"). Without the socket sd_notify does nothing. */
static const char *const sd_names[] = {"sd_notify", "sd_watchdog_enabled", "sd_pid_notify_with_fds",
				       "sd_listen_fds_with_names"};
enum { SD_NOTIFY, SD_WATCHDOG, SD_NOTIFY_FDS, SD_LISTEN_FDS, SD_NSYMS };
static void *sd_sym[SD_NSYMS];

/* 0, or -ENOENT said (the manager would wait for READY=1 until its start timeout). */
int notify_load(void)
{
	const char *sock = getenv("NOTIFY_SOCKET");
	char err[256];
	int ret;

	_Static_assert(ARRAY_SIZE(sd_names) == SD_NSYMS, "one name per symbol");
	if (!sock || !*sock)
		return 0;
	ret = util_dl_load(MESH_SYSTEMD_SONAME, sd_names, sd_sym, SD_NSYMS, err, sizeof(err));
	if (ret)
		log_error("NOTIFY_SOCKET is set (a service manager waits for READY=1) but %s (Debian's libsystemd0)",
			  err);
	return ret;
}

void notify(const char *state)
{
	if (sd_sym[SD_NOTIFY])
		((__typeof__(sd_notify) *)sd_sym[SD_NOTIFY])(0, state);
}

/* STATUS= for systemctl status: links UP of all. No-op without $NOTIFY_SOCKET. */
void notify_status(struct daemon *d, const char *extra)
{
	uint32_t up = mesh_links_up(&d->mesh);
	char state[128];

	d->status_up = up;
	snprintf(state, sizeof(state), "%sSTATUS=node %u: %u of %zu links UP", extra, d->mesh.self->id, up,
		 d->mesh.n_links);
	notify(state);
}

/* From the tick, which runs only after the batch's receives: a stalled loop stops feeding the
 * watchdog. */
void notify_tick(struct daemon *d, uint64_t now)
{
	if (d->wd_every_ms && now - d->wd_last_ms >= d->wd_every_ms) {
		notify("WATCHDOG=1");
		d->wd_last_ms = now;
	}
	if (mesh_links_up(&d->mesh) != d->status_up)
		notify_status(d, "");
}

/* How often to feed the watchdog: half the interval systemd allows (sd_watchdog_enabled(3)); 0: no
 * watchdog. */
uint64_t notify_watchdog_every_ms(void)
{
	uint64_t usec = 0;

	if (sd_sym[SD_WATCHDOG] && ((__typeof__(sd_watchdog_enabled) *)sd_sym[SD_WATCHDOG])(0, &usec) > 0)
		return MAX(1u, usec / 2000);
	return 0;
}

/* ---- the descriptor store ---- */

/* Whether the manager keeps a store for us: $FDSTORE, the number of descriptors it keeps (systemd
 * 254 sets it from FileDescriptorStoreMax=; Debian 12's 252 does not, so the unit sets it with the
 * same value, and meshd-keeper sets it), and a manager to send to. */
static bool store_on(void)
{
	const char *v = getenv("FDSTORE");

	return sd_sym[SD_NOTIFY_FDS] && sd_sym[SD_LISTEN_FDS] && v && strtoul(v, NULL, 10) > 0;
}

static int store_keep(void *ctx, const char *name, const int *fds, size_t n)
{
	char state[300];
	int ret;

	(void)ctx;
	snprintf(state, sizeof(state), "FDSTORE=1\nFDNAME=%s", name);
	ret = ((__typeof__(sd_pid_notify_with_fds) *)sd_sym[SD_NOTIFY_FDS])(0, 0, state, fds, (unsigned)n);
	return ret > 0 ? 0 : ret < 0 ? ret : -ENOTCONN;
}

static void store_drop(void *ctx, const char *name)
{
	char state[300];

	(void)ctx;
	snprintf(state, sizeof(state), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	notify(state);
}

/* At start, before the links form: the store on (keep and drop set) when the manager keeps one,
 * and the channels the last meshd kept there restored. */
void notify_store_take(struct mesh *m)
{
	char **names = NULL;
	int n, *fds;

	if (!store_on()) {
		if (getenv("LISTEN_FDS"))
			log_warn("descriptors were passed (LISTEN_FDS) but no store is kept for meshd ($FDSTORE): "
				 "channels kept by a last meshd fail");
		return;
	}
	m->store.keep = store_keep;
	m->store.drop = store_drop;
	n = ((__typeof__(sd_listen_fds_with_names) *)sd_sym[SD_LISTEN_FDS])(1, &names);
	if (n < 0) {
		log_warn("cannot take the descriptor store: %s", mesh_strerror(n));
		n = 0;
	}
	fds = calloc((size_t)n + 1, sizeof(*fds));
	if (fds) {
		for (int i = 0; i < n; i++)
			fds[i] = SD_LISTEN_FDS_START + i;
		channel_store_restore(m, fds, names, (size_t)n);
	} else {
		log_error("out of memory: the channels kept by the last meshd fail");
		for (int i = 0; i < n; i++)
			close(SD_LISTEN_FDS_START + i);
	}
	free(fds);
	for (int i = 0; names && names[i]; i++)
		free(names[i]);
	free(names);
}
