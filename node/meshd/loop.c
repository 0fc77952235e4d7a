/*
 * meshd's loop (daemon.h): a data-path thread per rail, each in its own epoll, polling its
 * transports and rings (cluster.polling) and moving its rail's channel data under its rail's lock
 * alone (the fast path); rail 0's also runs everything else under every lock (slow_path): the
 * timer's tick, signals, the control socket's queued work, lifelines, kicks, the metrics endpoint,
 * a drain's end. And the graceful stop: Goodbyes out before the QPs go.
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

/* Handles at most DRAIN_ROUNDS batches, so that a stream of completions never starves the timer
 * (keepalives) or the control socket; returns true when events may be left (come back at once:
 * completions already in a CQ raise no new readiness). all: look into every completion queue
 * (busy polling), not only the notified ones. *got counts the events handled. */
static bool drain_xport_n(struct daemon *d, xport_t *x, bool all, int *got)
{
	struct xport_event evs[EVENT_BATCH];
	int n;

	for (int round = 0; round < DRAIN_ROUNDS; round++) {
		n = all && round == 0 ? xport_poll_all(x, evs, EVENT_BATCH) : xport_poll(x, evs, EVENT_BATCH);
		for (int i = 0; i < n; i++)
			mesh_handle_event(&d->mesh, &evs[i]);
		mesh_reap(&d->mesh);
		if (n < 0)
			log_error("%s transport poll: %s", xport_name(x), mesh_strerror(n));
		else
			*got += n;
		if (n < EVENT_BATCH)
			return false;
	}
	return true;
}

/* Lets the Goodbye messages go out before the QPs are torn down, for at most STOP_GRACE_MS. Runs
 * when rail 0's thread is the only one left. */
static void stop_gracefully(struct daemon *d)
{
	uint64_t until = util_now_ms() + STOP_GRACE_MS;
	unsigned listeners = 0;
	struct epoll_event ev;

	/* From here the loop sleeps on the transports: their notifications must be armed again, and
	 * every CQ looked into (a completion from before the arm raises none). */
	for (size_t i = 0; i < d->n_xports; i++)
		xport_arm(d->xports[i]);
	/* Channels kept in the service manager's store are handed over to the next meshd: the peers
	 * keep theirs waiting for it (whether one comes is the manager's to decide: a stop for good
	 * empties the store, and the channels fail at both ends, at the peers after resume_timeout_ms).
	 * A listener kept alone (a server with no channel open yet) is handed over too. */
	for (const struct listener *li = d->mesh.chans->listeners; li; li = li->next)
		listeners += li->kept;
	d->mesh.store.handover = d->mesh.store.n_kept > 0 || listeners > 0;
	if (d->mesh.store.handover)
		log_info("stopping: %u channel%s and %u listener%s kept for the next meshd (peers wait up to %u ms)",
			 d->mesh.store.n_kept, d->mesh.store.n_kept == 1 ? "" : "s", listeners, listeners == 1 ? "" : "s",
			 d->cfg.resume_timeout_ms);
	mesh_stop(&d->mesh, d->mesh.store.handover ? MESH_ERESTARTING : MESH_ESHUTDOWN);
	while (util_now_ms() < until) {
		bool busy = false;
		int got = 0;

		for (size_t i = 0; i < d->n_xports; i++)
			drain_xport_n(d, d->xports[i], true, &got);
		for (size_t i = 0; i < d->mesh.n_links; i++)
			busy |= d->mesh.links[i]->send_busy != 0;
		if (!busy)
			break;
		/* Any fd may wake us; only the transports matter now (the other rails' sleep in their
		 * own epoll: a short wait, not their readiness, paces this loop). */
		epoll_wait(d->epfd, &ev, 1, 20);
	}
}

/* Is transport instance i this thread's? Instances are provider-major, one per rail. */
static bool dp_owns(const struct dp *dp, size_t i)
{
	return i % dp->d->mesh.n_rails == dp->rail;
}

static bool ev_received(const struct xport_event *ev)
{
	return ev->op == XPORT_OP_RECV || ev->op == XPORT_OP_RECV_IMM;
}

/* Whether ev must wait for the usual way behind events already left to it: those of its work
 * queue (RC completes a queue's work in order, and the usual way's handling of the earlier one,
 * say a control message, may change what the later one means; a failed completion, whose opcode
 * says nothing, holds its whole QP) and anything after a connection event. Other events may be
 * taken first: RC orders nothing across QPs, nor a QP's sends against its receives, so nothing in
 * mesh.c or channel.c may rely on that order (a stripe's immediates, a control message on QP 0
 * and a chunk on QP 1, already come in any order). Before, everything polled after the first
 * deferred event waited: in the slow VM's batches of 20, each rail keepalive took up to 20 of a
 * stream's completions the usual way with it. */
static bool deferrable(const struct dp *dp, const struct xport_event *ev)
{
	for (int k = 0; k < dp->n_deferred; k++) {
		const struct xport_event *e = &dp->deferred[k];

		if (e->type != XPORT_EV_COMPLETION ||
		    (e->conn == ev->conn && (e->status || ev->status || ev_received(e) == ev_received(ev))))
			return true;
	}
	return false;
}

/* The fast path's drain of transport i (mesh_fast_event), under the rail's lock alone: what it
 * cannot take goes to dp->deferred (with what must follow it, deferrable), and no more is polled
 * until the usual way has handled them. Returns true when events may be left. */
static bool drain_fast(struct dp *dp, size_t i, bool all, int *got)
{
	struct daemon *d = dp->d;
	struct mesh_numa_thread *t = &d->mesh.numa.threads[dp->rail];
	struct xport_event evs[EVENT_BATCH];

	for (int round = 0; round < DRAIN_ROUNDS; round++) {
		int n;

		if (dp->n_deferred)
			return true; /* after the usual way's turn (the next round of the loop) */
		n = all && round == 0 ? xport_poll_all(d->xports[i], evs, EVENT_BATCH)
				      : xport_poll(d->xports[i], evs, EVENT_BATCH);
		if (n < 0) {
			log_error("%s transport poll: %s", xport_name(d->xports[i]), mesh_strerror(n));
			return false;
		}
		*got += n;
		for (int k = 0; k < n; k++) {
			if (!deferrable(dp, &evs[k]) && mesh_fast_event(&d->mesh, dp->rail, &evs[k]))
				t->fast_events++;
			else
				dp->deferred[dp->n_deferred++] = evs[k];
		}
		if (n < EVENT_BATCH)
			return dp->n_deferred > 0;
	}
	return true;
}

/* One look at everything of this rail without waiting (the polling part of the loop): every
 * completion queue and every ring, under the rail's lock alone. Returns true when anything moved. */
static bool poll_once(struct dp *dp)
{
	struct daemon *d = dp->d;
	int got = 0, moved;

	for (size_t i = 0; i < d->n_xports; i++)
		if (dp_owns(dp, i))
			d->more[i] = drain_fast(dp, i, true, &got);
	moved = channel_poll_fast(&d->mesh, dp->rail);
	dp->ring_moves += (uint64_t)moved;
	dp->polled = true;
	return got + moved > 0;
}

/* Channel data this thread moved so far: completions and immediates its fast path took, kicks,
 * rings found moved. Only these keep adaptive polling going: a keepalive, the tick or a control
 * message is not followed by more of its kind within microseconds, and polling after each (200 us
 * of yields) grew an idle meshd's CPU with its peers (32 idle meshd over tcp: 0.12 -> 0.08
 * CPU-seconds per second without it). */
static uint64_t dp_data_moves(const struct dp *dp)
{
	const struct mesh_numa_thread *t = &dp->d->mesh.numa.threads[dp->rail];

	return t->fast_events + t->kicks + dp->ring_moves;
}

/* Polling modes (cluster.polling): event sleeps in epoll_wait whenever nothing is pending; busy
 * never sleeps; adaptive polls for poll_budget_us after the last work, then sleeps. While polling,
 * the rings carry MESH_DAEMON_POLLING so applications do not kick; before sleeping the flag is
 * cleared and everything looked at once more (proto/ring.h). */
static bool stay_hot(struct dp *dp, bool worked)
{
	uint64_t now;

	if (dp->d->poll_mode == POLL_EVENT)
		return false;
	if (dp->d->poll_mode == POLL_BUSY)
		return true;
	/* Cold and nothing moved: stays cold without reading the clock (a system call where the
	 * clock source is an emulated HPET, once per wake-up of an idle meshd). */
	if (!worked && !dp->hot_until_us)
		return false;
	now = util_now_us();
	if (worked)
		dp->hot_until_us = now + dp->d->cfg.poll_budget_us;
	if (now < dp->hot_until_us)
		return true;
	dp->hot_until_us = 0;
	return false;
}

/* Under the rail's lock: whether this thread must take every lock now (events left to the usual
 * way, channels left to the usual pump, channels to the local node with work queued). */
static bool slow_wanted(struct dp *dp)
{
	struct mesh *m = &dp->d->mesh;

	m->rail_deferring[dp->rail] = dp->n_deferred > 0;
	return dp->n_deferred || m->rail_slow[dp->rail] || channel_local_pending(m);
}

/* `meshctl drain` (admin_ops.c): meshd stops once no channel is left, or DRAIN_GRACE_MS after the
 * deadline (channel_tick failed what was left with MESH_EDRAINING at the deadline: their Closes go
 * out meanwhile). */
#define DRAIN_GRACE_MS 500
static void drain_check(struct daemon *d, uint64_t now, bool *running)
{
	struct mesh *m = &d->mesh;

	if (!m->chans->draining || !*running)
		return;
	if (!m->chans->n_channels)
		log_info("drained: no channel left, stopping");
	else if (now >= m->chans->drain_deadline_ms + DRAIN_GRACE_MS)
		log_info("drain deadline passed with %u channel(s) left (failed with \"%s\"): stopping",
			 m->chans->n_channels, mesh_strerror(-MESH_EDRAINING));
	else
		return;
	*running = false;
}

/* Everything but the fast path, under every lock: the events the fast path left, in order, then
 * the other descriptors of this batch (evs: timer, signals, control socket's work, kicks,
 * lifelines, metrics), the tick, the channels left to the usual pump and the channels to the local
 * node. Clears *running on a stop. */
/* The batch's other descriptors: the timer (its tick runs after the receives), signals (SIGHUP
 * reloads, the others stop), a stop, the control socket's work, lifelines, the metrics endpoint.
 * true when the timer fired. */
static bool slow_events(struct dp *dp, const struct epoll_event *evs, int n, bool *running)
{
	struct daemon *d = dp->d;
	struct mesh *m = &d->mesh;
	bool tick = false;

	for (int i = 0; i < n; i++) {
		uint32_t tag = (uint32_t)(evs[i].data.u64 >> 32);
		int fd = (int)(uint32_t)evs[i].data.u64;

		switch (tag) {
		case TAG_TIMER: {
			uint64_t exp;

			if (read(fd, &exp, sizeof(exp)) < 0 && errno != EAGAIN)
				log_warn("timerfd read: %m");
			tick = true; /* after the receives of this batch, below */
			break;
		}
		case TAG_SIGNAL: {
			struct signalfd_siginfo si = {0};

			if (read(fd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo == SIGHUP) {
				char err[512];

				daemon_reload(d, "SIGHUP", err, sizeof(err));
			} else if (si.ssi_signo) {
				log_info("signal %s: stopping", strsignal((int)si.ssi_signo));
				*running = false;
			}
			break;
		}
		case TAG_STOP:
			*running = false;
			break;
		case TAG_ADMIN_WORK:
			admin_work(&d->admin);
			break;
		case TAG_CH_LIFE:
			channel_on_lifeline(m, (uint32_t)fd);
			break;
		case TAG_METRICS:
			metrics_http_run(d->metrics);
			break;
		}
	}
	return tick;
}

/* The tick, under every lock, after the batch's receives: keepalives, timeouts and re-dials
 * (mesh_tick), a late tick said, the control socket's snapshot, the metrics endpoint's timeouts,
 * the watchdog, a drain's end. */
static void slow_tick(struct dp *dp, bool *running)
{
	struct daemon *d = dp->d;
	struct mesh *m = &d->mesh;
	uint64_t now, dropped;
	bool late;
	int got = 0;

	/* The timer must not judge before everything that arrived was read. A thread stopped
	 * while it polled (SIGSTOP, a long preemption) had left its CQs unarmed, so what
	 * arrived meanwhile raised no readiness: the loop's poll_once looked into every CQ
	 * just before this (a polling thread; a cold one sleeps armed, and its notified
	 * CQs were taken), so only what it left (a drain cut short) is taken here. Looking
	 * into every CQ again cost an idle meshd with 63 peers a tenth of its CPU under
	 * emulation (126 CQs ten times a second, rxe's poll_cq taking a lock each). And an
	 * every-CQ look must not be taken here: it leaves the transport polling (no
	 * re-arming), which polling = event never undoes (every CQ stayed unarmed after the
	 * first tick and a channel over rdma moved one message per tick, 50 ms), nor a cold
	 * thread that goes to sleep without its last look. */
	for (size_t i = 0; i < d->n_xports; i++)
		if (dp_owns(dp, i) && (d->poll_mode == POLL_EVENT || d->more[i]))
			d->more[i] = drain_xport_n(d, d->xports[i], false, &got);
	/* A tick far later than its period: the loop (or the machine) stalled, and a peer may
	 * have taken our links DOWN meanwhile; said, so that such a DOWN is explained. */
	now = util_now_ms();
	late = d->tick_last_ms && now - d->tick_last_ms > SLOW_WARN_MS;
	if (late && log_ratelimit_ok(&d->late_rl, now, &dropped))
		log_warn("the tick came %llu ms after the last one (period %u ms): this loop or the machine stalled "
			 "(%llu such lines not logged before this one)", (unsigned long long)(now - d->tick_last_ms),
			 d->tick_period_ms, (unsigned long long)dropped);
	d->tick_last_ms = now;
	/* And what arrived during the stall may not be read yet: a thread stopped between a
	 * look into its transports and their re-arming (or while it polled) raised no readiness
	 * for it, so this batch holds the timer alone, and the peers' keepalives sit unread
	 * (a meshd paused past its own keepalive timeout took three live links DOWN so, in
	 * mesh_test's mixed cluster in the VM). Such a tick judges no link or rail by its
	 * keepalives (everything else of the tick runs: skipping it all slowed a formation
	 * storm, where ticks come late): the loop takes a full look first (polled: it looks
	 * again before it sleeps; the other rails' threads look on their own), and the next
	 * tick, a period later, judges. Once only: a loop late at every tick still judges at
	 * every other one. */
	m->tick_no_liveness = late && !d->tick_deferred;
	d->tick_deferred = m->tick_no_liveness;
	if (m->tick_no_liveness)
		dp->polled = true;
	mesh_tick(m, now);
	m->tick_no_liveness = false;
	mesh_reap(m);
	drain_check(d, now, running);
	admin_snapshot(&d->admin, util_now_ms());
	metrics_http_run(d->metrics); /* its connection timeouts */
	notify_tick(d, util_now_ms());
}

static void slow_path(struct dp *dp, const struct epoll_event *evs, int n, bool *running)
{
	struct daemon *d = dp->d;
	struct mesh *m = &d->mesh;

	mesh_lock_all(&d->locks);
	m->numa.threads[dp->rail].slow_sections++;
	/* Every rail's: a rail's thread may hold events it polled and left here while it waits for
	 * these locks, and the tick below must not judge a link before reading them (a keepalive
	 * among them: a busy rail's thread lost a link so, with both peers alive). */
	for (uint32_t r = 0; r < m->n_rails; r++) {
		struct dp *o = &d->dp[r];

		m->numa.threads[r].deferred_events += (uint64_t)o->n_deferred;
		for (int k = 0; k < o->n_deferred; k++)
			mesh_handle_event(m, &o->deferred[k]);
		o->n_deferred = 0;
		m->rail_deferring[r] = false;
	}
	mesh_reap(m);
	/* Timers judge liveness only after everything that arrived has been read: a meshd that was
	 * not scheduled for a while (paused, or a loaded machine) finds its peers' keepalives in
	 * this batch, and must not declare a merely delayed link dead. */
	if (slow_events(dp, evs, n, running))
		slow_tick(dp, running);
	channel_pump_wanted(m, dp->rail);
	/* What this batch told channels to the local node reaches them now, outside any handler. */
	channel_local_run(m);
	/* What the handlers released goes after the batch (no event above may still name it). */
	mesh_reap(m);
	mesh_unlock_all(&d->locks);
}

/* The rail's lock for its fast path. Whoever waits to take every lock (the control plane, the
 * control socket) goes first: a mutex does not queue, and a busy rail's thread that unlocks and
 * locks again at once kept it from them for seconds. */
static void rail_lock(struct dp *dp)
{
	struct mesh_locks *k = &dp->d->locks;

	if (atomic_load_explicit(&k->all_waiting, memory_order_acquire)) {
		pthread_mutex_lock(&k->ctl);
		pthread_mutex_unlock(&k->ctl);
	}
	pthread_mutex_lock(&k->rail[dp->rail]);
}

int run(struct dp *dp)
{
	struct daemon *d = dp->d;
	struct mesh *m = &d->mesh;
	pthread_mutex_t *lock = &d->locks.rail[dp->rail];
	struct epoll_event evs[32];
	bool running = true, hot = d->poll_mode == POLL_BUSY;

	rail_lock(dp);
	if (hot)
		channel_set_polling(m, dp->rail, true);
	pthread_mutex_unlock(lock);
	while (running) {
		bool more = false, slow, worked, drained[MESH_XPORT_INSTANCES] = {false};
		uint64_t moves;
		int n, got = 0;

		rail_lock(dp);
		for (size_t i = 0; i < d->n_xports; i++)
			more |= dp_owns(dp, i) && d->more[i];
		more |= channel_local_pending(m);
		if (!hot && !more && dp->polled) {
			/* About to sleep: applications kick again from now on; what they published before
			 * they could see the cleared flag is found by this last look. */
			channel_set_polling(m, dp->rail, false);
			for (size_t i = 0; i < d->n_xports; i++)
				if (dp_owns(dp, i))
					xport_arm(d->xports[i]);
			moves = dp_data_moves(dp);
			if (poll_once(dp)) {
				hot = stay_hot(dp, dp_data_moves(dp) != moves);
				if (hot)
					channel_set_polling(m, dp->rail, true);
				slow = slow_wanted(dp);
				pthread_mutex_unlock(lock);
				if (slow)
					slow_path(dp, NULL, 0, &running);
				continue;
			}
			dp->polled = false; /* that look found nothing: now sleep */
			/* That look polled every CQ, which leaves the transport polling (a notification
			 * would not re-arm its CQ): sleep armed, as the cold rounds below rely on. */
			for (size_t i = 0; i < d->n_xports; i++)
				if (dp_owns(dp, i))
					xport_arm(d->xports[i]);
		}
		pthread_mutex_unlock(lock);
		if (hot && !more && ++dp->hot_rounds % HOT_EPOLL_EVERY)
			n = 0;
		else
			n = epoll_wait(dp->epfd, evs, (int)ARRAY_SIZE(evs), more || hot ? 0 : -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_error("epoll_wait: %m");
			return -errno;
		}
		slow = false;
		rail_lock(dp);
		m->numa.threads[dp->rail].wakes++;
		moves = dp_data_moves(dp);
		for (int i = 0; i < n; i++) {
			uint32_t tag = (uint32_t)(evs[i].data.u64 >> 32);
			int fd = (int)(uint32_t)evs[i].data.u64;

			if (tag == TAG_CH_KICK) {
				/* One of this rail's channels: its application published and meshd slept. */
				if (channel_on_kick_fast(m, (uint32_t)fd, dp->rail)) {
					m->numa.threads[dp->rail].kicks++;
					got++;
				}
			} else if (tag != TAG_XPORT) {
				slow = true; /* the control plane's, below */
			} else if ((size_t)fd < d->n_xports) {
				d->more[fd] = drain_fast(dp, (size_t)fd, false, &got);
				drained[fd] = true;
			}
		}
		/* A transport cut short by DRAIN_ROUNDS continues now, after the others had their turn. */
		for (size_t i = 0; i < d->n_xports; i++)
			if (dp_owns(dp, i) && d->more[i] && !drained[i])
				d->more[i] = drain_fast(dp, i, false, &got);
		worked = n > 0;
		if (d->poll_mode != POLL_EVENT) {
			/* Polling, or channel data just moved: look into everything. A cold thread that a
			 * keepalive's completion or the timer woke took what notified it and sleeps again,
			 * armed: a look into every CQ there, and the last look before sleeping that it
			 * entails, cost an idle meshd two polls of each of its 126 CQs per wake-up. */
			if (hot || dp_data_moves(dp) != moves)
				worked = poll_once(dp) || worked;
			hot = stay_hot(dp, dp_data_moves(dp) != moves);
			if (hot && !m->polling[dp->rail])
				channel_set_polling(m, dp->rail, true);
		}
		slow |= slow_wanted(dp);
		pthread_mutex_unlock(lock);
		if (slow)
			slow_path(dp, evs, n, &running);
		/* Nothing to do this round: let whoever we wait for (an application, rxe's softirq,
		 * the peer meshd on the same machine) have the CPU. */
		if (hot && !worked)
			sched_yield();
	}
	return 0;
}

static void *data_path_main(void *arg)
{
	struct dp *dp = arg;
	struct mesh_numa *nu = &dp->d->mesh.numa;
	int node = mesh_rail_node(&dp->d->mesh, dp->rail, -1);

	nu->threads[dp->rail].tid = (uint32_t)gettid();
	if (node >= 0 && CPU_COUNT(&nu->topo.cpus[node])) {
		int ret = pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &nu->topo.cpus[node]);

		if (ret)
			log_warn("cannot pin the data-path thread of rail %u to node %d: %s", dp->rail, node,
				 strerror(ret));
	}
	dp->status = run(dp);
	if (dp->rail == 0) {
		/* The others stop first (the control socket's thread too): then the goodbyes go out with
		 * nobody else on the mesh. */
		admin_stop(&dp->d->admin);
		for (uint32_t r = 1; r < dp->d->mesh.n_rails; r++) {
			uint64_t one = 1;

			if (write(dp->d->dp[r].stop_fd, &one, sizeof(one)) < 0)
				log_warn("cannot stop the data-path thread of rail %u: %m", r);
			pthread_join(dp->d->dp[r].thread, NULL);
		}
		stop_gracefully(dp->d);
	}
	return NULL;
}

/* Starts a data-path thread per rail, named after its device ("dp-rxe0": the kernel keeps 15
 * characters), and waits for them. */
int run_data_path(struct daemon *d)
{
	struct mesh_numa *nu = &d->mesh.numa;
	uint32_t rails = d->mesh.n_rails, started = 1;
	int ret = 0;

	for (uint32_t r = 0; r < rails; r++) {
		struct mesh_numa_thread *t = &nu->threads[r];

		memcpy(t->name, "dp-", 3);
		util_strlcpy(t->name + 3, "meshd", sizeof(t->name) - 3);
		t->devices[0] = 0;
		for (size_t i = 0; i < nu->n_devs; i++) {
			if (nu->devs[i].rail != r)
				continue;
			if (t->devices[0])
				strncat(t->devices, ",", sizeof(t->devices) - strlen(t->devices) - 1);
			else
				util_strlcpy(t->name + 3, nu->devs[i].name, sizeof(t->name) - 3);
			strncat(t->devices, nu->devs[i].name, sizeof(t->devices) - strlen(t->devices) - 1);
		}
		t->node = mesh_rail_node(&d->mesh, r, -1);
	}
	nu->n_threads = rails;
	/* Rails 1.. first: rail 0's thread stops them when it ends, so it starts only when they all run. */
	for (started = 1; started < rails && !ret; started++) {
		ret = -pthread_create(&d->dp[started].thread, NULL, data_path_main, &d->dp[started]);
		if (!ret)
			pthread_setname_np(d->dp[started].thread, nu->threads[started].name);
	}
	if (!ret) {
		ret = -pthread_create(&d->dp[0].thread, NULL, data_path_main, &d->dp[0]);
		if (!ret)
			pthread_setname_np(d->dp[0].thread, nu->threads[0].name);
	} else {
		started--; /* the one that failed */
	}
	if (ret) {
		log_error("cannot start the data-path threads: %s", strerror(-ret));
		for (uint32_t r = 1; r < started; r++) {
			uint64_t one = 1;

			if (write(d->dp[r].stop_fd, &one, sizeof(one)) < 0)
				log_warn("cannot stop the data-path thread of rail %u: %m", r);
			pthread_join(d->dp[r].thread, NULL);
		}
	} else {
		pthread_join(d->dp[0].thread, NULL); /* rail 0 joins the others */
	}
	return ret ? ret : d->dp[0].status;
}

/* The data-path threads' state; rails 1.. get their own epoll set with their transports, a stop
 * eventfd and (admin_bind_channels) their channels' kicks. Before the control socket serves: a
 * channel's kick goes to its rail's set from the first. */
int dp_open(struct daemon *d)
{
	int ret = 0;

	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++) {
		d->dp[r].d = d;
		d->dp[r].rail = r;
		d->dp[r].epfd = r ? -1 : d->epfd;
		d->dp[r].stop_fd = -1;
	}
	for (uint32_t r = 1; r < d->mesh.n_rails && !ret; r++) {
		struct dp *dp = &d->dp[r];

		dp->epfd = epoll_create1(EPOLL_CLOEXEC);
		dp->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (dp->epfd < 0 || dp->stop_fd < 0 || add_fd(dp->epfd, dp->stop_fd, TAG(TAG_STOP)))
			ret = -errno;
		for (size_t i = 0; i < d->n_xports && !ret; i++) {
			struct epoll_event ee = {.events = EPOLLIN, .data.u64 = TAG(TAG_XPORT) | i};

			if (dp_owns(dp, i) && epoll_ctl(dp->epfd, EPOLL_CTL_ADD, xport_event_fd(d->xports[i]), &ee))
				ret = -errno;
		}
	}
	if (ret)
		log_error("cannot set up the data-path threads' epoll: %s", strerror(-ret));
	return ret;
}

void dp_close(struct daemon *d)
{
	for (uint32_t r = 1; r < MESH_RAILS_MAX; r++) {
		if (d->dp[r].epfd >= 0)
			close(d->dp[r].epfd);
		if (d->dp[r].stop_fd >= 0)
			close(d->dp[r].stop_fd);
		d->dp[r].epfd = d->dp[r].stop_fd = -1;
	}
}
