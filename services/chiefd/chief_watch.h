/* chiefd's Watch streams: one thread sends each stream JobStatus when what it shows changes (at most
 * every min_interval), a heartbeat otherwise, and the job's last word at the end. The handler that
 * takes a Watch call is chief_rpc.c's; it hands the stream over here. */
#pragma once
#include <stdint.h>

struct chief_status;
struct chief_watch;
struct rpc_call;

/* Starts the thread that serves the streams of what st shows. Returns 0 and *ret, or -errno. */
int chief_watch_new(struct chief_status *st, struct chief_watch **ret);
/* Hands a Watch stream to the thread (min_interval_ms 0: 500, below 100: 100; heartbeat_ms 0: 5000).
 * Returns 0, -ENOMEM, or -ESHUTDOWN once the streams are closed (the call is the caller's to fail
 * then). Thread-safe. */
int chief_watch_add(struct chief_watch *cw, struct rpc_call *call, uint32_t min_interval_ms, uint32_t heartbeat_ms);
/* Ends every stream (each gets the job's last word first) and joins the thread; refuses new streams. */
void chief_watch_stop(struct chief_watch *cw);
/* Stops (as chief_watch_stop) and frees; NULL-safe, returns NULL. */
struct chief_watch *chief_watch_free(struct chief_watch *cw);
