// Internal to src/plan: the cluster file reader's pieces that the heterogeneous loader
// (hetero_cluster.cpp) reuses. Only with toml++ (TRIAX_HAVE_TOML).
#pragma once
#ifdef TRIAX_HAVE_TOML
#include <toml++/toml.h>

#include <filesystem>
#include <string>

#include "triax/plan/cluster.h"

namespace triax::plan {

// Parses a cluster file; IoError naming the file (and line) when it is missing or malformed.
toml::table parse_cluster_file(const std::filesystem::path& path);
// A homogeneous cluster from a parsed file's root table; errors name `file` and the key.
Cluster read_cluster_table(const toml::table& root, const std::string& file);

}  // namespace triax::plan
#endif
