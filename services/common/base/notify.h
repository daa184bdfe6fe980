/* Thin wrappers over sd_notify(3) for the service manager: READY, STATUS, STOPPING, WATCHDOG.
 * Each is a no-op returning 0 when NOTIFY_SOCKET is unset (not started by systemd). Thread-safe. */
#pragma once
#include <stdint.h>

/* Each returns > 0 when the message was sent, 0 without NOTIFY_SOCKET, or -errno. Callers usually
 * ignore the result: a lost notification is not a reason to stop. */
int notify_ready(void);
int notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int notify_stopping(void);
int notify_watchdog(void);

/* The watchdog interval systemd asked for (WatchdogSec=) in microseconds, or 0 when the watchdog is
 * off or not meant for this process. Ping at half of it. */
uint64_t notify_watchdog_usec(void);
