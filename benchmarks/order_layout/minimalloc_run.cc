// The benchmark's driver for google/minimalloc's solver: benchmarks/order_layout/layout_csv.py
// compiles it with minimalloc's src/{minimalloc,solver,sweeper,validator}.cc in a temp folder.  minimalloc's
// own main.cc and converter.cc need a newer abseil than Debian's libabsl-dev (20220623: no
// absl/log, absl::string_view distinct from std::string_view), so this driver reads the CSV and
// writes the offsets itself and uses only the solver API.
//
//   minimalloc_run INPUT.csv CAPACITY TIMEOUT_SECONDS OUTPUT
//
// INPUT has a header naming at least id,lower,upper,size.  Prints one line, "solved <seconds>
// <height>" (OUTPUT gets one offset per buffer, in input order) or "failed <seconds> <status>".
// The seconds cover Solve() only, like minimalloc's CLI reports them.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "solver.h"

static std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string cell; std::getline(ss, cell, ',');) out.push_back(cell);
  return out;
}

int main(int argc, char* argv[]) {
  if (argc != 5) {
    std::cerr << "usage: minimalloc_run INPUT.csv CAPACITY TIMEOUT_SECONDS OUTPUT\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::string line;
  std::map<std::string, size_t> column;
  if (std::getline(in, line)) {
    const auto head = Fields(line);
    for (size_t k = 0; k < head.size(); ++k) column[head[k]] = k;
  }
  for (const char* name : {"id", "lower", "upper", "size"}) {
    if (!column.count(name)) {
      std::cerr << argv[1] << ": no column " << name << "\n";
      return 2;
    }
  }
  minimalloc::Problem problem;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = Fields(line);
    minimalloc::Buffer buffer;
    buffer.id = f[column["id"]];
    buffer.lifespan = {std::stoll(f[column["lower"]]), std::stoll(f[column["upper"]])};
    buffer.size = std::stoll(f[column["size"]]);
    problem.buffers.push_back(buffer);
  }
  problem.capacity = std::strtoll(argv[2], nullptr, 10);
  minimalloc::SolverParams params;  // minimalloc's defaults, as its CLI uses them
  params.timeout = absl::Seconds(std::strtod(argv[3], nullptr));
  minimalloc::Solver solver(params);
  const auto start = std::chrono::steady_clock::now();
  auto solution = solver.Solve(problem);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!solution.ok()) {
    std::cout << "failed " << seconds << " " << solution.status().code() << "\n";
    return 1;
  }
  std::ofstream out(argv[4]);
  for (const auto offset : solution->offsets) out << offset << "\n";
  std::cout << "solved " << seconds << " " << solution->height << "\n";
  return 0;
}
