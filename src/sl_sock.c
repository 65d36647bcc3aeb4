/* TCP for the bootstrap.  SPDX-License-Identifier: MIT */
#include "sl_sock.h"
#include "sl_time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long one poll sleeps between progress calls. */
#define SL_SOCK_PROGRESS_MS 1

sl_status_t sl_sock_io(int fd, void *buf, size_t len, int writing,
                       double deadline, const sl_sock_progress_t *progress,
                       sl_errbuf_t *eb)
{
    char         *p = buf;
    struct pollfd pfd;
    ssize_t       n;
    int           rc, ms;

    while (len > 0) {
        pfd.fd     = fd;
        pfd.events = writing ? POLLOUT : POLLIN;
        ms         = sl_deadline_ms(deadline);
        if (progress != NULL && progress->fn != NULL) {
            progress->fn(progress->arg);
            ms = (ms < 0 || ms > SL_SOCK_PROGRESS_MS) ? SL_SOCK_PROGRESS_MS
                                                      : ms;
        }
        rc = poll(&pfd, 1, ms);
        if (rc == 0 && !sl_deadline_passed(deadline)) {
            continue;
        }
        if (rc == 0) {
            return sl_error(eb, STAGELINK_ERR_TIMEOUT,
                            "bootstrap %s of %zu bytes timed out; raise "
                            "STAGELINK_TIMEOUT or check that every rank runs",
                            writing ? "send" : "receive", len);
        }
        if (rc < 0) {
            if (errno == EINTR) {
                continue;
            }
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "bootstrap poll: %s",
                            strerror(errno));
        }
        n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            continue;
        }
        if (n <= 0) {
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                            "bootstrap peer closed the connection with %zu "
                            "bytes left to %s (%s); a rank exited or failed",
                            len, writing ? "send" : "receive",
                            (n < 0) ? strerror(errno) : "EOF");
        }
        p   += n;
        len -= (size_t)n;
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_sock_resolve(const sl_launcher_t *l, int passive,
                                   struct addrinfo **res, sl_errbuf_t *eb)
{
    const char     *host = passive ? l->bind : l->addr;
    struct addrinfo hints;
    char            port[16];
    int             rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = passive ? AI_PASSIVE : 0;
    snprintf(port, sizeof(port), "%d", l->port);
    rc = getaddrinfo(host, port, &hints, res);
    if (rc != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "cannot resolve rendezvous address %s:%d: %s",
                        host, l->port, gai_strerror(rc));
    }
    return STAGELINK_SUCCESS;
}

static void sl_sock_tune(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sl_status_t sl_sock_listen(const sl_launcher_t *l, int *fd_out,
                           sl_errbuf_t *eb)
{
    struct addrinfo *res;
    sl_status_t      status;
    int              one = 1;
    int              fd;

    SL_CHECK(sl_sock_resolve(l, 1, &res, eb));
    fd = socket(res->ai_family,
                res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "socket(): %s",
                          strerror(errno));
        goto out_free;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "rank 0 cannot listen on %s:%d: %s; pick a free "
                          "MASTER_PORT or an address of this host "
                          "(STAGELINK_BOOTSTRAP_BIND)",
                          l->bind, l->port, strerror(errno));
        close(fd);
        goto out_free;
    }
    *fd_out = fd;
    status  = STAGELINK_SUCCESS;
out_free:
    freeaddrinfo(res);
    return status;
}

sl_status_t sl_sock_connect(const sl_launcher_t *l, double deadline,
                            int *fd_out, sl_errbuf_t *eb)
{
    struct addrinfo *res;
    sl_status_t      status;
    useconds_t       pause_us;
    int              fd, err;

    SL_CHECK(sl_sock_resolve(l, 0, &res, eb));
    /* Rank 0 may not listen yet: retry until the deadline, soon at first
     * (it is usually a moment away), then every 20 ms. */
    for (pause_us = 1000;; pause_us = (pause_us < 10000) ? 2 * pause_us : 20000) {
        fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "socket(): %s",
                              strerror(errno));
            goto out_free;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            break;
        }
        err = errno;
        close(fd);
        if (sl_deadline_passed(deadline)) {
            status = sl_error(eb, STAGELINK_ERR_TIMEOUT,
                              "cannot reach rank 0 at %s:%d: %s; check "
                              "MASTER_ADDR/MASTER_PORT and that rank 0 runs",
                              l->addr, l->port, strerror(err));
            goto out_free;
        }
        usleep(pause_us);
    }
    sl_sock_tune(fd);
    *fd_out = fd;
    status  = STAGELINK_SUCCESS;
out_free:
    freeaddrinfo(res);
    return status;
}

int sl_sock_accept(int lfd, char *peer, size_t len)
{
    struct sockaddr_storage sa;
    socklen_t               sa_len = sizeof(sa);
    char                    host[INET6_ADDRSTRLEN] = "?";
    int                     fd, port = 0;

    memset(&sa, 0, sizeof(sa));
    fd = accept4(lfd, (struct sockaddr *)&sa, &sa_len, SOCK_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    sl_sock_tune(fd);
    if (sa.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&sa;

        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&sa;

        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    snprintf(peer, len, sa.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host,
             port);
    return fd;
}
