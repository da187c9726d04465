// gpt_train: a GPT-2-shaped model trained through remat, with a sequence length drawn per
// batch. `gpt_train --budget-fraction 0.5 --json` trains twice (unconstrained, then at half
// its peak) and reports both.
#include "examples/gpt_model.h"

int main(int argc, char** argv) {
  remat::examples::GptModel model;
  return remat::examples::run_main(argc, argv, model);
}
