// swapnet-cli's entry point: the command line (cli/main.cpp).
#include "commands.h"

int main(int argc, char** argv) { return swapnet::cli::cli_main(argc, argv); }
