/*
 * agent.c: the least in-sandbox agent a create needs, without a Go runtime.
 *
 * A measuring instrument, not a product: bench/agent-floor.sh runs
 * sandboxd with it in envd's place to measure what a create would cost
 * with an agent written in C or Rust (issue 24's CPU per create, the
 * 200-against-50 burst, fairness). It does what envd does before and at a
 * create's first answer: as PID 1 it brings loopback up, reaps children,
 * looks the default user up in /etc/passwd, listens on --socket (bound
 * under a temporary name, then renamed, as envd does, so that sandboxd's
 * inotify sees it once it accepts) and on --listen, and answers every
 * request with 204. It serves no command or file, so anything after the
 * create fails. Build: cc -O2 -static -o envd agent.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* answer reads one request (headers, then Content-Length bytes of body)
   and answers 204, closing the connection as sandboxd's probe asks. */
static void answer(int c) {
	char buf[8192], sink[4096];
	size_t n = 0;
	ssize_t r;
	char *end = NULL;
	while (n < sizeof buf - 1 && (r = read(c, buf + n, sizeof buf - 1 - n)) > 0) {
		n += (size_t)r;
		buf[n] = 0;
		if ((end = strstr(buf, "\r\n\r\n")) != NULL)
			break;
	}
	if (end != NULL) {
		size_t want = 0, have = n - (size_t)(end + 4 - buf);
		char *cl = strcasestr(buf, "\r\ncontent-length:");
		if (cl != NULL && cl < end)
			want = strtoul(cl + 17, NULL, 10);
		while (have < want && (r = read(c, sink, sizeof sink)) > 0)
			have += (size_t)r;
		static const char ok[] = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
		if (write(c, ok, sizeof ok - 1) < 0)
			perror("write");
	}
	close(c);
}

/* loopbackUp is envd's loopback.Up: a new network namespace's lo is down. */
static void loopbackUp(void) {
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct ifreq ifr = {0};
	strcpy(ifr.ifr_name, "lo");
	if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		perror("lo");
	else {
		ifr.ifr_flags |= IFF_UP;
		if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
			perror("lo up");
	}
	if (s >= 0)
		close(s);
}

/* lookupUser is envd's check of its default user: a scan of /etc/passwd. */
static int lookupUser(const char *name) {
	FILE *f = fopen("/etc/passwd", "re");
	char line[1024];
	size_t len = strlen(name);
	int found = 0;
	if (f == NULL)
		return 0;
	while (!found && fgets(line, sizeof line, f) != NULL)
		found = strncmp(line, name, len) == 0 && line[len] == ':';
	fclose(f);
	return found;
}

static int listenUnix(const char *path) {
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char tmp[sizeof sa.sun_path];
	if (snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof tmp)
		return -1;
	strcpy(sa.sun_path, tmp);
	unlink(tmp);
	int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (u < 0 || bind(u, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(u, 128) < 0 ||
	    rename(tmp, path) < 0)
		return -1;
	return u;
}

static int listenTCP(const char *addr) {
	const char *colon = strrchr(addr, ':');
	struct sockaddr_in si = {.sin_family = AF_INET};
	char host[64] = "127.0.0.1";
	if (colon == NULL)
		return -1;
	if (colon > addr && (size_t)(colon - addr) < sizeof host) {
		memcpy(host, addr, (size_t)(colon - addr));
		host[colon - addr] = 0;
	}
	si.sin_port = htons((unsigned short)atoi(colon + 1));
	if (inet_pton(AF_INET, host, &si.sin_addr) != 1)
		return -1;
	int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (t < 0)
		return -1;
	setsockopt(t, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(t, (struct sockaddr *)&si, sizeof si) < 0 || listen(t, 128) < 0)
		return -1;
	return t;
}

int main(int argc, char **argv) {
	const char *sock = NULL, *addr = NULL, *user = "user";
	int init = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--version")) {
			puts("agentfloor");
			return 0;
		}
		if (!strcmp(argv[i], "--init"))
			init = 1;
		else if (i + 1 < argc && !strcmp(argv[i], "--socket"))
			sock = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--listen"))
			addr = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--default-user"))
			user = argv[++i];
	}
	if (init)
		loopbackUp();
	if (!lookupUser(user))
		fprintf(stderr, "agentfloor: user %s missing, using root\n", user);
	struct pollfd p[2];
	int np = 0;
	if (sock != NULL) {
		if ((p[np].fd = listenUnix(sock)) < 0) {
			perror(sock);
			return 1;
		}
		p[np++].events = POLLIN;
	}
	if (addr != NULL && *addr != 0) {
		if ((p[np].fd = listenTCP(addr)) < 0) {
			perror(addr);
			return 1;
		}
		p[np++].events = POLLIN;
	}
	if (np == 0) {
		fputs("agentfloor: nothing to serve on: set --listen or --socket\n", stderr);
		return 2;
	}
	for (;;) {
		if (poll(p, (nfds_t)np, init ? 1000 : -1) > 0)
			for (int i = 0; i < np; i++)
				if (p[i].revents & POLLIN) {
					int c = accept4(p[i].fd, NULL, NULL, SOCK_CLOEXEC);
					if (c >= 0)
						answer(c);
				}
		while (init && waitpid(-1, NULL, WNOHANG) > 0) {
		}
	}
}
