/* The sandbox ("pause") process of every pod on the real test node: it holds the pod's namespaces, reaps
 * the children it inherits as PID 1, and exits on SIGTERM or SIGINT. Built static, run FROM scratch. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGTERM, &on_stop, NULL) || sigaction(SIGINT, &on_stop, NULL) ||
        sigaction(SIGCHLD, &on_child, NULL)) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
