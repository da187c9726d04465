// mlp_train: a deterministic MLP trained through remat (the examples' correctness anchor).
#include "examples/mlp_model.h"

int main(int argc, char** argv) {
  remat::examples::MlpModel model;
  return remat::examples::run_main(argc, argv, model);
}
