#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <pthread.h>

namespace remat::kernels::cpu {
namespace {

// Note [BLAS across fork]
// OpenBLAS (its pthreads build, Debian's) registers a fork handler that stops its worker
// threads before fork() returns in the parent. A product in flight on another thread then
// waits for ever on workers that are gone. That happened when the step driver planned
// beside the steps (Checkmate's solver runs in a forked child: planner/checkmate.cc) while
// the example GPT's step ran a product, and it would happen to any program that forks
// (a data loader's workers) while a product runs. So every product holds this lock shared,
// and a fork handler of ours takes it exclusively: fork() waits for the products in flight,
// and none starts until the fork is done. Fork handlers run in the reverse order of their
// registration, so ours is registered after OpenBLAS's and runs before it. Writers are
// preferred, so products that keep overlapping cannot hold a fork off for ever.
void init_lock(pthread_rwlock_t* l) {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(l, &attr);
  pthread_rwlockattr_destroy(&attr);
}

pthread_rwlock_t* fork_lock() {
  static pthread_rwlock_t* lock = [] {
    static pthread_rwlock_t l;
    init_lock(&l);
    return &l;
  }();
  return lock;
}

void lock_for_fork() { pthread_rwlock_wrlock(fork_lock()); }
void unlock_in_parent() { pthread_rwlock_unlock(fork_lock()); }
// The child's one thread has another id than the one that took the lock, which glibc would
// not take as the writer's unlock: the child starts from a fresh lock instead.
void fresh_lock_in_child() { init_lock(fork_lock()); }

// OpenBLAS registers its handler when it initializes, which asking for its thread count
// makes sure of.
void register_fork_handler_once() {
  static const bool registered =
      openblas_get_num_threads() > 0 &&
      pthread_atfork(lock_for_fork, unlock_in_parent, fresh_lock_in_child) == 0;
  (void)registered;
}

}  // namespace

void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  register_fork_handler_once();
  pthread_rwlock_rdlock(fork_lock());
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  pthread_rwlock_unlock(fork_lock());
}

}  // namespace remat::kernels::cpu
