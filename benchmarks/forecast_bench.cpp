// forecast_bench: the forecaster's training step (LSTM(64) -> Dense(1) over 24 steps: forward,
// backpropagation through time, Adam) on the CPU backend, timed per round. Run alone it prints
// ms per step and windows per second; benchmarks/forecast_torch_compare.py alternates it with
// the same step in PyTorch (torch.nn.LSTM + nn.Linear + Adam) and prints each round's ratio.
//   forecast_bench [--batch 32] [--steps 50] [--rounds 3] [--json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include <triax/backend/backend.h>
#include <triax/core/env.h>
#include <triax/forecast/lstm.h>
#include <omp.h>

namespace fc = triax::forecast;

int main(int argc, char** argv) {
  CLI::App app{"forecast_bench: the LSTM forecaster's training step on the CPU backend"};
  int batch = 32, steps = 50, rounds = 3;
  bool json = false;
  app.add_option("--batch", batch, "windows per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "steps per round")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "one JSON line per round");
  CLI11_PARSE(app, argc, argv);
  // The LSTM's ops are small (batch x 256 per step): threads cost more than they save, and
  // spinning pools starve on a shared machine. One thread unless OMP_NUM_THREADS says otherwise.
  if (!triax::omp_threads_chosen_by_user()) omp_set_num_threads(1);
  auto be = triax::make_cpu_backend(triax::DType::f32);
  fc::LstmRegressor m(*be);
  m.init(1);
  std::mt19937 gen(2);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(batch) * fc::kWindowHours * fc::kFeatures), y(batch);
  for (auto& v : x) v = nd(gen);
  for (auto& v : y) v = nd(gen);
  int64_t t = 0;
  double first_loss = 0, loss = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      m.zero_grad();
      m.forward(x, batch, fc::kWindowHours);
      loss = m.backward_mse(y);
      if (t == 0) first_loss = loss;
      m.adam_step(1e-3, ++t, 1.0);
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (json)
      std::printf("{\"round\": %d, \"ms_per_step\": %.6f, \"loss\": %.6f}\n", r, 1e3 * sec / steps, loss);
    else
      std::printf("round %d: %.3f ms/step, %.0f windows/s, loss %.5f\n", r, 1e3 * sec / steps, batch * steps / sec,
                  loss);
    std::fflush(stdout);
  }
  // The check: fitting one fixed batch must lower its loss.
  if (!(loss < first_loss && std::isfinite(loss))) {
    std::fprintf(stderr, "forecast_bench: the loss did not fall (%g -> %g)\n", first_loss, loss);
    return 1;
  }
  return 0;
}
