/* Harness: who a TLS peer is, from what its certificate names (authz_peer_from_names: the DNS
 * subjectAltNames gRPC hands over, any bytes a certificate of the job's CA may carry), and the task
 * names of calls (authz_parse_task). The input is the names, NUL-separated. A peer found must be a task
 * of the job whose DNS name is one it gave (in any case); its name is always a terminated string. (A certificate
 * itself is parsed by OpenSSL inside gRPC's handshake, and psfleet reads only its own certificate
 * files: no more of x509 is reachable from input.) */
#include <strings.h>

#include "authz.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char *s = malloc(size + 1);
        const char *names[16];
        size_t n = 0;
        memcpy(s, data, size);
        s[size] = 0;
        for (char *at = s; n < 16 && at <= s + size; at += strlen(at) + 1)
                names[n++] = at;
        struct peer p;
        authz_peer_from_names("fuzz", names, n, &p);
        FUZZ_CHECK(memchr(p.name, 0, sizeof(p.name)) != NULL, "a peer name without its end");
        if (p.role != PEER_UNKNOWN && p.role != PEER_INSECURE) {
                char task[AUTHZ_TASK_MAX], dns[256];
                authz_task_name(p.role, p.index, task, sizeof(task));
                FUZZ_CHECK(authz_dns_name("fuzz", task, dns, sizeof(dns)) == 0, "no DNS name for %s", task);
                bool given = false;
                for (size_t i = 0; i < n && !given; i++)
                        given = strcasecmp(names[i], dns) == 0;   /* DNS names: any case */
                FUZZ_CHECK(given, "peer %s (%s) from names that do not include it", p.name, dns);
        }
        enum peer_role role;
        uint32_t index;
        if (authz_parse_task(names[0], &role, &index) == 0) {
                char task[AUTHZ_TASK_MAX];
                authz_task_name(role, index, task, sizeof(task));
                FUZZ_CHECK(task[0] != 0, "task \"%s\" parsed to no name", names[0]);
        }
        free(s);
        return 0;
}
