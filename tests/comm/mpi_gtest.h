// The main of a gtest binary run under mpirun: MPI for the process, the same tests on
// every rank, and a nonzero exit on every rank when any rank failed (so mpirun's
// status does not depend on which rank it reports).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <functional>

#include "npurt/comm/mpi.h"

namespace npurt::testing {

// `before` runs after gtest has read its flags, `after` before MPI finalizes.
inline int run_tests_on_every_rank(int argc, char** argv, const std::function<void()>& before = {},
                                   const std::function<void()>& after = {}) {
  auto session = comm::mpi_init(argc, argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().to_string().c_str());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (before) before();
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (after) after();
  return any_failed;
}

}  // namespace npurt::testing
