/*
 * meshd and its service manager (sd_notify(3)): READY=1 once the listeners and the control socket
 * serve, STATUS= with the links UP, WATCHDOG=1 from the tick, RELOADING=1 and STOPPING=1. libsystemd
 * is opened only when $NOTIFY_SOCKET names a manager's socket.
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

/* libsystemd's sd_notify(3), loaded only when $NOTIFY_SOCKET names a service manager's socket
 * (systemd's Type=notify sets it): linked, libsystemd mapped itself and six compression and crypto
 * libraries into every meshd, a run by hand or in a test included, which was a tenth of meshd's start
 * where 64 start at once (docs/design.md, "Formation"). Without the socket sd_notify does nothing. */
static const char *const sd_names[] = {"sd_notify", "sd_watchdog_enabled"};
enum { SD_NOTIFY, SD_WATCHDOG, SD_NSYMS };
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
