# Sourced by the Makefile's recipes: puts the project's .venv tools (cmake,
# ninja) first on PATH when setup.sh had to install them there.
if [ -d "$(dirname "${BASH_SOURCE[0]}")/../.venv/bin" ]; then
  PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.venv/bin" && pwd):$PATH"
  export PATH
fi
