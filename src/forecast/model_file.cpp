// The forecaster's model file (forecast/lstm.h): safetensors (io/safetensors.h) with PyTorch's
// parameter names, the scaler, and metadata; every tensor checked by name, shape and value on load.
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "triax/core/error.h"
#include "triax/forecast/lstm.h"
#include "triax/io/safetensors.h"

namespace triax::forecast {
namespace {

constexpr const char* kFormat = "triax-forecast-lstm-v1";

std::string feature_list() {
  std::string s;
  for (auto f : kFeatureNames) {
    if (!s.empty()) s.push_back(',');
    s.append(f);
  }
  return s;
}

// The tensor after TensorFile's own shape check (IoError naming file, tensor and both shapes), with
// every value finite.
std::vector<float> checked_floats(const io::SafetensorsReader& r, const std::string& name, const io::Shape& shape) {
  auto v = r.read(name, shape);
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) TRIAX_THROW(IoError, "{}: tensor '{}' element {} is {}", r.path(), name, i, v[i]);
  return v;
}

}  // namespace

Scaler as_stored(const Scaler& s) {
  Scaler out;
  for (int f = 0; f < kFeatures; ++f) {
    out.mean[f] = static_cast<float>(s.mean[f]);
    out.std[f] = static_cast<float>(s.std[f]);
  }
  return out;
}

void save_model(const std::string& path, const LstmRegressor& model, const Scaler& scaler,
                const std::map<std::string, std::string>& metadata) {
  io::SafetensorsWriter w;
  for (const auto& p : model.params()) {
    const auto v = model.get(p.name);
    w.add(p.name, p.shape, std::vector<float>(v.begin(), v.end()));
  }
  w.add("scaler.mean", {kFeatures}, std::vector<float>(scaler.mean.begin(), scaler.mean.end()));
  w.add("scaler.std", {kFeatures}, std::vector<float>(scaler.std.begin(), scaler.std.end()));
  w.add_metadata("format", kFormat);
  w.add_metadata("features", feature_list());
  w.add_metadata("target", fmt::format("next hour's {}", kFeatureNames[kTargetFeature]));
  w.add_metadata("window_hours", std::to_string(kWindowHours));
  w.add_metadata("hidden", std::to_string(model.shape().hidden));
  for (const auto& [k, v] : metadata) w.add_metadata(k, v);
  w.write(path);
}

LoadedModel load_model(const std::string& path, Backend& be) {
  const io::SafetensorsReader r(path);
  LoadedModel out;
  out.metadata = r.metadata();
  if (auto it = out.metadata.find("features"); it != out.metadata.end() && it->second != feature_list())
    TRIAX_THROW(IoError, "{}: the model reads features '{}', this triax-forecast reads '{}'", path, it->second,
                feature_list());
  out.model = std::make_unique<LstmRegressor>(be, LstmShape{});
  std::set<std::string> expected{"scaler.mean", "scaler.std"};
  for (const auto& p : out.model->params()) {
    expected.insert(p.name);
    const auto v = checked_floats(r, p.name, p.shape);
    out.model->set(p.name, std::vector<double>(v.begin(), v.end()));
  }
  const auto mean = checked_floats(r, "scaler.mean", {kFeatures});
  const auto sd = checked_floats(r, "scaler.std", {kFeatures});
  for (int f = 0; f < kFeatures; ++f) {
    if (!(sd[f] > 0))
      TRIAX_THROW(IoError, "{}: scaler.std of {} is {}, must be > 0", path, kFeatureNames[f], sd[f]);
    out.scaler.mean[f] = mean[f];
    out.scaler.std[f] = sd[f];
  }
  for (const auto& t : r.tensors())
    if (!expected.count(t.name))
      TRIAX_THROW(IoError, "{}: unexpected tensor '{}' (a triax-forecast model holds only {} tensors)", path, t.name,
                  expected.size());
  return out;
}

}  // namespace triax::forecast
