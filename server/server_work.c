/* server/server_work.c - kvtier-server's workers: the threads that do the
 * store's I/O for requests (server_net.c hands them over and takes them back
 * through the server's job and done queues). A worker fills a request's
 * status and results (a GET's record lent in place or read into a staging
 * buffer, a PUT committed or stored, EXISTS, DEL, STATS, LIST); the network
 * thread then moves the bytes and replies. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server_net.h"

/* ---- the workers ---- */

static void wake(kvt_server *sv) {
  const uint64_t one = 1;
  ssize_t w = write(sv->wake_fd, &one, sizeof(one));
  (void)w;
}

static void work_get(kvt_server *sv, sreq *r) {
  kvt_srv_get g;
  r->status = kvt_srv_store_get_begin(sv->st, r->s->tenant, &r->req.u.data.key, &g);
  if (r->status)
    return;
  r->out_len = g.len;
  if (g.len > r->req.u.data.len) {
    r->status = KVT_ENOBUFS;
    kvt_srv_store_get_end(sv->st, &g, -1);
    return;
  }
  /* A value in a memory tier goes out from where it lies (registered for
   * this write), saving a copy; else through a staging buffer. */
  const uint8_t *rec = NULL;
  if (g.len && kvt_srv_store_get_lend(sv->st, &g, &rec) == 0) {
    if (kvt_fab_mr_reg(sv->fab, rec, SRV_REC_HDR + g.len, KVT_FAB_LOCAL, &r->lend_mr) == 0) {
      r->g = g;
      r->lent = 1;
      r->src = rec + SRV_REC_HDR;
      r->status = 0;
      return; /* finish() returns the loan and counts the hit */
    }
    kvt_srv_store_get_unlend(sv->st, &g);
  }
  r->stage = kvt_srv_buf_get(sv, SRV_REC_HDR + g.len);
  r->status = r->stage ? kvt_srv_store_get_read(sv->st, &g, r->stage->p) : -ENOMEM;
  kvt_srv_store_get_end(sv->st, &g, r->status == 0);
}

static void work(kvt_server *sv, sreq *r) {
  const int tenant = r->s->tenant;
  r->out_len = 0;
  switch (r->req.h.opcode) {
  case KVT_PROTO_PUT:
    r->status = r->put.tier ? kvt_srv_store_put_commit(sv->st, &r->put, 1)
                            : kvt_srv_store_put(sv->st, tenant, &r->req.u.data.key, r->stage->p,
                                                r->req.u.data.len);
    break;
  case KVT_PROTO_GET:
    work_get(sv, r);
    break;
  case KVT_PROTO_EXISTS:
    r->status = kvt_srv_store_exists(sv->st, tenant, &r->req.u.key.key, &r->out_len);
    break;
  case KVT_PROTO_DEL:
    r->status = kvt_srv_store_del(sv->st, tenant, &r->req.u.key.key);
    break;
  case KVT_PROTO_STATS:
    memset(r->stats, 0, sizeof(r->stats));
    kvt_srv_store_stats(sv->st, tenant, r->stats);
    r->stats[KVT_STAT_SESSIONS] = atomic_load(&sv->n_sessions);
    r->stats[KVT_STAT_AUTH_REFUSED] = atomic_load(&sv->auth_refused);
    r->stats[KVT_STAT_TOO_BIG] = atomic_load(&sv->too_big);
    r->stats[KVT_STAT_DEFERRED] = atomic_load(&sv->deferred);
    r->stats[KVT_STAT_UPTIME_S] = (uint64_t)(kvt_srv_now_s() - sv->started);
    r->status = 0;
    break;
  case KVT_PROTO_LIST: {
    if (!r->list)
      r->list =
          kvt_alloc(sv->ctx, KVT_PROTO_LIST_MAX * sizeof(*r->list), _Alignof(kvt_proto_list_entry));
    const uint32_t max = r->req.u.list.max && r->req.u.list.max < KVT_PROTO_LIST_MAX
                             ? r->req.u.list.max
                             : KVT_PROTO_LIST_MAX;
    r->status = r->list ? kvt_srv_store_list(sv->st, tenant, r->req.u.list.cursor, r->list, max,
                                             &r->list_n, &r->list_next)
                        : -ENOMEM;
    break;
  }
  default:
    r->status = KVT_EPROTO;
  }
}

void *kvt_srv_worker_main(void *arg) {
  kvt_server *sv = arg;
  pthread_mutex_lock(&sv->mu);
  for (;;) {
    while (!sv->job_head && !sv->stop_workers)
      pthread_cond_wait(&sv->cv, &sv->mu);
    if (!sv->job_head)
      break;
    sreq *r = sv->job_head;
    sv->job_head = r->next;
    if (!sv->job_head)
      sv->job_tail = NULL;
    pthread_mutex_unlock(&sv->mu);
    work(sv, r);
    pthread_mutex_lock(&sv->mu);
    r->next = NULL;
    if (sv->done_tail)
      sv->done_tail->next = r;
    else
      sv->done_head = r;
    sv->done_tail = r;
    wake(sv);
  }
  pthread_mutex_unlock(&sv->mu);
  return NULL;
}
