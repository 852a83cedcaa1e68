// gpt_eval --sample: continue a prompt with sampled tokens (one process, tp = pp = 1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <triax/model/sampler.h>

struct SampleRequest {
  std::string weights;
  int heads = 0;
  int64_t tokens = 0;              // N new tokens
  std::string prompt;              // text (byte-level models: vocab 256)
  std::vector<int> prompt_tokens;  // token ids (any model)
  triax::SamplingOptions sampling;
  uint64_t seed = 1234;
  bool json = false;
};

// Prints the continuation (decoded text for byte-level models, token ids otherwise; --json also
// a JSON object line). Throws triax::Error for bad weights, prompts or options.
void run_sample(const SampleRequest& r);
