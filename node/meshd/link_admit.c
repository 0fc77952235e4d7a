/*
 * Admission of our dials, as TCP's congestion window paces segments: how many attempts of ours may
 * be in flight (mesh_dial_window; link_connect.c's mesh_admit dials within it), and the window's
 * growth as our attempts come UP and its halving when they time out or a peer has no room. Not
 * admin.c, the control socket: this admits our own dials, never a client. It calls nothing of the
 * link layer, the bottom of it: every other link file may call it.
 */
#include <stdint.h>

#include "link_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

#define ADM_WINDOW_INITIAL 4.0 /* attempts of ours in flight at the start: ramps up as they come UP */
#define ADM_CUT_GAP_MIN_MS 500 /* halve at most this often when no attempt has come UP yet */

void mesh_adm_init(struct mesh *m)
{
	m->adm.window = ADM_WINDOW_INITIAL;
	m->adm.ssthresh = (double)UINT16_MAX; /* slow start until the first sign of congestion */
	m->adm.next = m->n_links ? m->self->id % m->n_links : 0; /* nodes start at different peers */
	m->adm.ticks = 1; /* failed_tick 0 of a new link names no tick */
}

/* One of our attempts came UP after sample_ms: the window grows (as TCP's per acknowledgement) and
 * the attempt time is smoothed as RFC 6298 smooths round trips. */
void mesh_adm_on_up(struct mesh *m, uint64_t sample_ms)
{
	struct mesh_admission *a = &m->adm;

	if (!a->srtt_ms) {
		a->srtt_ms = MAX(sample_ms, 1);
		a->rttvar_ms = sample_ms / 2;
	} else {
		uint64_t d = a->srtt_ms > sample_ms ? a->srtt_ms - sample_ms : sample_ms - a->srtt_ms;

		a->rttvar_ms = (3 * a->rttvar_ms + d) / 4;
		a->srtt_ms = MAX((7 * a->srtt_ms + sample_ms) / 8, 1);
	}
	a->window += a->window < a->ssthresh ? 1.0 : 1.0 / a->window;
	a->window = MIN(a->window, (double)MAX(m->cfg->max_handshakes, 1u));
}

/* One of our attempts timed out, or a peer had no room for it: halve the window, once per smoothed
 * attempt time (the attempts of one burst fail together and are one signal, as one lost window is
 * one signal to TCP). */
void mesh_adm_on_congestion(struct mesh *m, uint64_t t)
{
	struct mesh_admission *a = &m->adm;

	if (a->cuts && t - a->last_cut_ms < MAX(a->srtt_ms, (uint64_t)ADM_CUT_GAP_MIN_MS))
		return;
	a->ssthresh = MAX(MIN(a->window, (double)m->cfg->max_handshakes) / 2, 1.0);
	a->window = a->ssthresh;
	a->last_cut_ms = t;
	a->cuts++;
	log_debug("admission: window %.1f after a congested attempt (%llu cuts)", a->window, (unsigned long long)a->cuts);
}

/* How long a dial may go without a single QP answering: twice the resolve timeout (so that with
 * several providers the next one gets its turn soon), but never shorter than attempts are taking
 * now (a loaded machine answers late, and an attempt given up on is re-dialled at full cost). */
uint64_t mesh_adm_no_answer_ms(const struct mesh *m)
{
	return MAX(2ull * m->cfg->connect_timeout_ms, m->adm.srtt_ms + 4 * m->adm.rttvar_ms);
}

uint32_t mesh_dial_window(const struct mesh *m)
{
	return (uint32_t)MIN(m->adm.window, (double)m->cfg->max_handshakes);
}
