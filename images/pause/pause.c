/* The pod sandbox's process: holds the pod's namespaces and does nothing else. As PID 1 of a
 * pod that shares its process namespace it reaps orphaned children; SIGTERM or SIGINT end it
 * with status 0. Built static (gcc -static) for an image FROM scratch. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop}, on_child = {.sa_handler = reap,
                                                               .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGTERM, &on_stop, NULL) || sigaction(SIGINT, &on_stop, NULL) ||
      sigaction(SIGCHLD, &on_child, NULL))
    return 1;
  for (;;) pause();
}
