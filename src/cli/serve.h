// `npurt serve`: its arguments and entry point.
#pragma once

#include <cstdint>
#include <string>

namespace npurt::cli {

struct ServeArgs {
  std::string model;  // empty: default_model_path()
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 8;      // sequences decoded together
  int max_queue = 64;    // requests waiting for a slot before 503, per device
  std::string device = "sim";  // a device driver by name (hal/driver.h)
  int devices = 1;             // devices of that driver, a replica of the model on each
  uint32_t cores = 8;
  uint32_t context = 4096;  // positions per sequence
  uint32_t prefill_chunk = 64;
  int64_t max_body_bytes = 1 << 20;
  int deadline_s = 600;
  std::string chat_template;  // a Jinja file; empty: the model file's, else Gemma's turns
};

int run_serve(const ServeArgs& args);

}  // namespace npurt::cli
