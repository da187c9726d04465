// treelstm_train: a Tree-LSTM whose graph differs for every sample, trained through remat.
#include "examples/treelstm_model.h"

int main(int argc, char** argv) {
  remat::examples::TreeLstmModel model;
  return remat::examples::run_main(argc, argv, model);
}
