// Validation against published results: the Megatron-LM SC21 Table 1 rows (Narayanan et al.
// 2021) predicted on the selene-a100 preset with the software of that paper, micro-batch size
// searched as its authors tuned it, the schedule Megatron-LM's default 1F1B.
#pragma once
#include <filesystem>
#include <vector>

#include "triax/plan/planner.h"

namespace triax::plan {

struct Sc21Row {
  double params_billion = 0;
  int heads = 0, hidden = 0, layers = 0;
  int tp = 0, pp = 0, dp = 0, gpus = 0;
  long global_batch = 0;
  double tflops_per_gpu = 0;  // published, counted with the paper's Eq. 3
  double percent_of_peak = 0;
  double aggregate_pflops = 0;
};

// Reads the CSV (header line, '#' comment lines). IoError naming the file, line and column on
// anything missing or malformed.
std::vector<Sc21Row> load_sc21_table(const std::filesystem::path& csv);

// The model of a row: vocabulary 51200, sequence 2048, ffn 4h, tied embeddings, learned positions.
ModelShape sc21_model(const Sc21Row& r);
// Megatron-LM as used for the paper: fp16 with fp16 gradient all-reduce after backward (no
// overlap), unfused attention with dropout, full recomputation, scatter/gather p2p, no ZeRO.
Layout sc21_software();

struct Sc21Prediction {
  Sc21Row row;
  Estimate estimate;          // the best (micro-batch, schedule, vpp) that fits
  double predicted_tflops = 0;  // Eq. 3 FLOPs / (seconds * gpus)
  double error = 0;             // (predicted - published) / published
};

Sc21Prediction predict_sc21_row(const Sc21Row& r, const CollectiveModel& net);

}  // namespace triax::plan
