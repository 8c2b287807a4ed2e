/* Fan a kernel's work out over pthreads: the shared runner of freight's CPU kernels. Included by
 * the kernels in this folder; kernels/cpu/build.py keys its cache on this file too. */
#ifndef FREIGHT_THREADS_H
#define FREIGHT_THREADS_H

#include <pthread.h>
#include <stdint.h>

#define MAX_THREADS 64

/* Run fn on each of the n tasks (an array of `size`-byte structs): tasks 1..n-1 on new threads,
 * task 0 on the caller's; a task whose thread could not be created runs on the caller's too. */
static void run_tasks(void *(*fn)(void *), void *tasks, int64_t size, int64_t n) {
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    char *t = (char *)tasks;
    for (int64_t i = 1; i < n; i++) started[i] = pthread_create(&ids[i], 0, fn, t + i * size) == 0;
    for (int64_t i = 1; i < n; i++)
        if (!started[i]) fn(t + i * size);
    if (n > 0) fn(t);
    for (int64_t i = 1; i < n; i++)
        if (started[i]) pthread_join(ids[i], 0);
}

/* How many of num_threads threads `work` units are worth, at least min_per_thread each (>= 1). */
static int64_t threads_for(int64_t work, int64_t min_per_thread, int64_t num_threads) {
    int64_t n = num_threads > MAX_THREADS ? MAX_THREADS : num_threads;
    const int64_t worth = work / min_per_thread;
    if (n > worth) n = worth;
    return n < 1 ? 1 : n;
}

#endif
