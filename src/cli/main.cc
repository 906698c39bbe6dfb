// The npurt command: `npurt generate`, `npurt demo`, `npurt soak`, `npurt disasm FILE`,
// `npurt asm FILE -o IMAGE`, `npurt info MODEL`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "cli/batch.h"
#include "cli/generate.h"
#include "cli/serve.h"
#include "cli/soak.h"
#include "npurt/isa/assembler.h"
#include "npurt/isa/disasm.h"
#include "npurt/isa/isa.h"
#include "npurt/version.h"

namespace npurt::cli {
int run_demo(uint32_t cores, bool sanitize, uint32_t seed);
int run_info(const std::string& path);
}

namespace {

// How `npurt generate` chooses each token: the options of models::SamplingParams and
// stop strings.
void add_sampling_options(CLI::App& cmd, npurt::models::SamplingParams& p, std::vector<std::string>& stop) {
  cmd.add_option("--temperature", p.temperature, "0: greedy; otherwise sample from the softmax of logits / T")
      ->capture_default_str();
  cmd.add_option("--top-k", p.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd.add_option("--top-p", p.top_p, "sample among the fewest most likely tokens whose mass reaches p, (0, 1]")
      ->capture_default_str();
  cmd.add_option("--min-p", p.min_p, "drop tokens less than min-p times as likely as the best, [0, 1]")
      ->capture_default_str();
  cmd.add_option("--repetition-penalty", p.repetition_penalty,
                 "> 1 discourages every token of the prompt and output (1: off)")
      ->capture_default_str();
  cmd.add_option("--presence-penalty", p.presence_penalty, "subtracted from the logit of every token of the output")
      ->capture_default_str();
  cmd.add_option("--frequency-penalty", p.frequency_penalty,
                 "subtracted from a token's logit once per occurrence in the output")
      ->capture_default_str();
  cmd.add_option("--seed", p.seed, "sampling seed: the same prompt, options and seed give the same text")
      ->capture_default_str();
  cmd.add_option("--logprobs", p.top_logprobs,
                 "print each token's log-probability and those of the N most likely (0 .. 20) to stderr")
      ->capture_default_str();
  cmd.add_option("--stop", stop, "text that ends generation (repeatable); it and what follows are not printed");
}

// The options of the commands that run the batching engine (batch, serve).
void add_engine_options(CLI::App& cmd, std::string& model, std::string& device, int& parallel, uint32_t& cores,
                        uint32_t& prefill_chunk) {
  cmd.add_option("--model", model, "GGUF file (default: $NPURT_MODEL, else " + npurt::cli::default_model_path() + ")");
  cmd.add_option("--device", device, "a device driver by name (sim: the simulated NPU)")->capture_default_str();
  cmd.add_option("--parallel", parallel, "sequences decoded together; a request's text is the same at any value")
      ->check(CLI::Range(1, static_cast<int>(npurt::isa::kMaxTmvBatch)))
      ->capture_default_str();
  cmd.add_option("--cores", cores, "logical cores of the simulated NPU")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd.add_option("--prefill-chunk", prefill_chunk,
                 "prompt tokens per prefill call between decode steps (0: one per decode step)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
}

int disasm_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "npurt disasm: cannot open %s\n", path.c_str());
    return 1;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto text = npurt::isa::disassemble_bytes(bytes);
  if (!text.ok()) {
    std::fprintf(stderr, "npurt disasm: %s: %s\n", path.c_str(), text.status().to_string().c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}

// Errors read "npurt asm: FILE:LINE:COL: CODE: message", the form editors jump to;
// the assembler's messages start with "line L, column C: ".
std::string located(const std::string& path, const npurt::Status& s) {
  const std::string& message = s.message();
  const std::string code(npurt::status_code_name(s.code()));
  int line = 0, column = 0, consumed = 0;
  if (std::sscanf(message.c_str(), "line %d, column %d: %n", &line, &column, &consumed) == 2 && consumed > 0) {
    return path + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + code + ": " +
           message.substr(static_cast<size_t>(consumed));
  }
  return path + ": " + code + ": " + message;
}

int asm_file(const std::string& path, const std::string& out_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "npurt asm: cannot open %s\n", path.c_str());
    return 1;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // No device is named, so its local-memory limit is not applied (as for disasm).
  auto bytes = npurt::isa::assemble_bytes(text);
  if (!bytes.ok()) {
    std::fprintf(stderr, "npurt asm: %s\n", located(path, bytes.status()).c_str());
    return 1;
  }
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "npurt asm: cannot write %s\n", out_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"npurt: run compiled operators on NPUs (default device: the simulated NPU)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "npurt " NPURT_VERSION_STRING);

  uint32_t cores = 8, seed = 1;
  bool sanitize = false;
  auto* demo = app.add_subcommand("demo", "compile a few kernels, run them on the simulated NPU, check them "
                                          "against host references and print the device counters");
  demo->add_option("--cores", cores, "logical cores of the simulated NPU")->check(CLI::Range(1, 1024));
  demo->add_flag("--sanitize", sanitize, "run with the simulator's hazard sanitizer on");
  demo->add_option("--seed", seed, "random seed for the inputs");

  npurt::cli::SoakOptions soak;
  auto* soak_cmd = app.add_subcommand("soak", "sequence calls and pipelined worker runs on the simulated NPU while it "
                                              "injects faults: checks results, errors, hangs and leaks");
  soak_cmd->add_option("--runs", soak.runs, "sequence calls plus worker runs")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
      ->capture_default_str();
  soak_cmd->add_option("--fault-rate", soak.fault_rate, "probability that one device operation fails, every site")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  soak_cmd->add_option("--hang-rate", soak.hang_rate,
                       "probability that a launch of a worker run hangs (default: fault rate / 10 with a run timeout)")
      ->check(CLI::Range(0.0, 1.0));
  soak_cmd->add_option("--seed", soak.seed, "seed of the inputs, the workload choices and the faults")
      ->capture_default_str();
  soak_cmd->add_option("--cores", soak.cores, "logical cores of the simulated NPU")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  soak_cmd->add_option("--depth", soak.depth, "worker pipeline slots")->check(CLI::Range(1, 8))->capture_default_str();
  soak_cmd->add_option("--run-timeout-ms", soak.run_timeout_ms,
                       "worker run timeout, which ends hung runs (0: none, hangs then wait for the watchdog)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600} * 1000))
      ->capture_default_str();
  soak_cmd->add_option("--reset-rate", soak.reset_rate, "probability that the worker is reset while a batch runs")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  soak_cmd->add_option("--watchdog-ms", soak.watchdog_ms, "bound on every call, run and read")
      ->check(CLI::Range(int64_t{1}, int64_t{3600} * 1000))
      ->capture_default_str();
  soak_cmd->add_option("--report", soak.max_reported, "failures printed in full per kind")->capture_default_str();

  std::string file;
  auto* disasm = app.add_subcommand("disasm", "verify a kernel image file and print its disassembly");
  disasm->add_option("FILE", file, "image file")->required();

  std::string asm_out;
  auto* assemble = app.add_subcommand("asm", "assemble a listing (the text disasm prints, or written by hand) "
                                             "into a verified kernel image file");
  assemble->add_option("FILE", file, "assembly text file")->required();
  assemble->add_option("-o,--output", asm_out, "image file to write")->required();

  npurt::cli::GenerateArgs gen;
  auto* generate = app.add_subcommand("generate", "text generation with Gemma-3 from a GGUF file, greedy or "
                                                  "sampled, streamed as it is produced");
  generate->add_option("--model", gen.model, "GGUF file (default: $NPURT_MODEL, else " +
                                                 npurt::cli::default_model_path() + ")");
  generate->add_option("--prompt", gen.prompt, "text to continue")->capture_default_str();
  generate->add_option("--max-tokens", gen.max_tokens, "tokens to generate at most")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  generate->add_option("--device", gen.device,
                       "a device driver by name (sim: the simulated NPU) or host (the f32 host oracle)")
      ->capture_default_str();
  generate->add_option("--cores", gen.cores, "logical cores of the simulated NPU")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  generate->add_option("--prefill-chunk", gen.prefill_chunk,
                       "prompt tokens per batched prefill call (0: token by token)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  generate->add_option("--kv-cache", gen.kv_cache,
                       "the KV cache's element type: f32 (exact), or f16 / bf16 (half the bytes, keys and values "
                       "rounded; on the simulated NPU)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();

  CLI::Option* speculate =
      generate->add_option("--speculate", gen.speculate,
                           "draft tokens (prompt lookup) verified per step on one simulated NPU; 0: one token per "
                           "step. The text is the same either way")
          ->check(CLI::Range(0, static_cast<int>(npurt::isa::kMaxTmvBatch) - 1))
          ->capture_default_str();
  generate->add_option("--devices", gen.devices, "simulated NPUs in this process, the model split over them")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  generate->add_option("--tp", gen.tp, "tensor-parallel over MPI: one device per rank (mpirun -np N npurt "
                                       "generate --tp N); rank 0 prints")
      ->check(CLI::Range(1, 64));
  generate->add_option("--collective-timeout", gen.collective_timeout_ms,
                       "ms a collective waits for its peers before it fails the run")
      ->check(CLI::Range(int64_t{1}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  add_sampling_options(*generate, gen.sampling, gen.stop);
  generate->add_option("--device-memory", gen.device_memory,
                       "MiB of global memory per device (default: sized for the device's share of the model)")
      ->check(CLI::Range(1, 1 << 20));

  npurt::cli::BatchArgs bat;
  auto* batch = app.add_subcommand("batch", "many prompts decoded together (continuous batching over a paged KV "
                                            "cache); one JSON line per prompt, in order, to stdout");
  add_engine_options(*batch, bat.model, bat.device, bat.parallel, bat.cores, bat.prefill_chunk);
  batch->add_option("--prompts", bat.prompts, "file of one prompt a line (-: standard input)")->required();
  batch->add_option("--max-tokens", bat.max_tokens, "tokens to generate at most per prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  add_sampling_options(*batch, bat.sampling, bat.stop);

  npurt::cli::ServeArgs srv;
  auto* serve = app.add_subcommand("serve", "an OpenAI-compatible HTTP server (completions, chat, streaming, "
                                            "metrics, a chat page) over continuous batching");
  add_engine_options(*serve, srv.model, srv.device, srv.parallel, srv.cores, srv.prefill_chunk);
  serve->add_option("--devices", srv.devices,
                    "devices of the driver, a replica of the model on each; a request goes to the least busy and "
                    "its text is the same on any")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  serve->add_option("--host", srv.host, "address to listen on")->capture_default_str();
  serve->add_option("--port", srv.port, "port to listen on (0: any free one, printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  serve->add_option("--max-queue", srv.max_queue, "requests waiting for a slot on a device before new ones get 503")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  serve->add_option("--context", srv.context, "positions per sequence (prompt and output)")
      ->check(CLI::Range(16, 1 << 20))
      ->capture_default_str();
  serve->add_option("--max-body", srv.max_body_bytes, "largest request body accepted, bytes")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30))
      ->capture_default_str();
  serve->add_option("--deadline", srv.deadline_s, "seconds a request may run before it is cancelled")
      ->check(CLI::Range(1, 24 * 3600))
      ->capture_default_str();
  serve->add_option("--chat-template", srv.chat_template,
                    "a Jinja chat template file for /v1/chat/completions (default: the model file's "
                    "tokenizer.chat_template, else Gemma's turn format)");

  std::string model;
  auto* info = app.add_subcommand("info", "print a GGUF model file's header, metadata and tensor table");
  info->add_option("MODEL", model, "GGUF file")->required();

  CLI11_PARSE(app, argc, argv);
  if (generate->parsed()) {
    gen.speculate_set = speculate->count() > 0;
    return npurt::cli::run_generate(gen);
  }
  if (batch->parsed()) return npurt::cli::run_batch(bat);
  if (serve->parsed()) return npurt::cli::run_serve(srv);
  if (demo->parsed()) return npurt::cli::run_demo(cores, sanitize, seed);
  if (soak_cmd->parsed()) return npurt::cli::run_soak_command(soak);
  if (disasm->parsed()) return disasm_file(file);
  if (assemble->parsed()) return asm_file(file, asm_out);
  if (info->parsed()) return npurt::cli::run_info(model);
  return 1;
}
