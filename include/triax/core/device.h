// Where memory lives: a device kind (cpu or cuda) and an ordinal. Header-only, like dtype.h, so
// every layer (tensors, communicators, the CUDA backend) can name a device without linking more.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace triax {

enum class DeviceKind : uint8_t { cpu, cuda };

constexpr std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda";
  }
  return "?";
}

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // the ordinal among devices of this kind; always 0 for cpu

  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int ordinal) { return {DeviceKind::cuda, ordinal}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::cpu; }
  constexpr bool is_cuda() const { return kind == DeviceKind::cuda; }
  friend constexpr bool operator==(Device a, Device b) = default;

  // "cpu", "cuda:1"
  std::string str() const {
    return kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("{}:{}", device_kind_name(kind), index);
  }
};

}  // namespace triax
