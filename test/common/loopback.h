/*
 * A TCP port on loopback held for a test's own rendezvous, with no race
 * against other tests running at the same time.  hold_port() binds a socket
 * to a port the kernel picks (port 0), with SO_REUSEADDR, and keeps it bound
 * without listening: while it is open no other socket gets that port (a
 * bind to port 0 and the local port of an outgoing connection never pick a
 * bound port, a bind without SO_REUSEADDR to it fails), yet rank 0's
 * listener (sl_sock_listen sets SO_REUSEADDR) can bind and listen on it.
 * Close the returned socket once the job is over; listen() on it makes it
 * "another listener" holding the port.  SPDX-License-Identifier: MIT
 */
#ifndef SL_TEST_LOOPBACK_H
#define SL_TEST_LOOPBACK_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

/* The held socket (close it when done) and its port in *port, or -1 with
 * the reason on stderr. */
static inline int hold_port(int *port)
{
    struct sockaddr_in a   = {.sin_family = AF_INET};
    socklen_t          len = sizeof(a);
    int                one = 1;
    int                fd  = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "cannot hold a loopback port: %s\n", strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

#endif
