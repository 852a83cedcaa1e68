// Structured log records: TRIAX_LOG_FORMAT=json turns every log line into one JSON object
// {time, rank, host, level, message, fields} for Filebeat/Logstash. This header is the pure
// formatter (unit-tested); log.h decides the format and writes.
#pragma once
#include <string>
#include <string_view>

#include "triax/core/log.h"

namespace triax::log {

enum class Format { text, json };

// From TRIAX_LOG_FORMAT (text | json; text when unset; anything else: text and one warning).
Format format();
void set_format(Format f);

// One record as a single line (no trailing newline). fields_json: the text of a JSON object
// ("" for none); text that is not a JSON object is kept as {"raw": text}. time_unix_s is printed
// as RFC 3339 UTC with milliseconds.
std::string json_record(Level l, std::string_view message, std::string_view fields_json, int rank,
                        std::string_view host, double time_unix_s);

const char* level_name(Level l);

}  // namespace triax::log
