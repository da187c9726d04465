// resnet_train: a CIFAR-shaped ResNet with batch norm trained through remat.
#include "examples/resnet_model.h"

int main(int argc, char** argv) {
  remat::examples::ResnetModel model;
  return remat::examples::run_main(argc, argv, model);
}
