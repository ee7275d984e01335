// Non-negative least squares (fit_nonnegative), with which the device profile's cost model is
// fitted: every subset of the columns solved by the normal equations, the best non-negative
// fit kept.
#include "swapnet/partitioner.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace swapnet {
namespace {

// Solves A x = b (n x n, Gaussian elimination with partial pivoting); false if singular.
bool solve(std::vector<std::vector<double>> A, std::vector<double> b, std::vector<double>* x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::fabs(A[r][c]) > std::fabs(A[piv][c])) piv = r;
    }
    if (std::fabs(A[piv][c]) < 1e-300) return false;
    std::swap(A[c], A[piv]);
    std::swap(b[c], b[piv]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = A[r][c] / A[c][c];
      for (size_t k = c; k < n; ++k) A[r][k] -= f * A[c][k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0);
  for (size_t c = n; c-- > 0;) {
    double s = b[c];
    for (size_t k = c + 1; k < n; ++k) s -= A[c][k] * (*x)[k];
    (*x)[c] = s / A[c][c];
  }
  return true;
}

}  // namespace

std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& X, const std::vector<double>& y) {
  const size_t p = X.empty() ? 0 : X[0].size();
  std::vector<double> best(p, 0.0);
  double best_sse = 0;
  for (double v : y) best_sse += v * v;  // all-zero coefficients
  for (std::uint32_t subset = 1; subset < (1u << p); ++subset) {
    std::vector<size_t> cols;
    for (size_t c = 0; c < p; ++c) {
      if (subset & (1u << c)) cols.push_back(c);
    }
    // Columns are scaled to unit norm first: bytes (~1e7) and counts (~10) in one system.
    std::vector<double> scale(cols.size(), 0.0);
    for (size_t a = 0; a < cols.size(); ++a) {
      for (const auto& row : X) scale[a] += row[cols[a]] * row[cols[a]];
      scale[a] = scale[a] > 0 ? std::sqrt(scale[a]) : 1.0;
    }
    std::vector<std::vector<double>> A(cols.size(), std::vector<double>(cols.size(), 0.0));
    std::vector<double> b(cols.size(), 0.0), x;
    for (size_t r = 0; r < X.size(); ++r) {
      for (size_t a = 0; a < cols.size(); ++a) {
        b[a] += X[r][cols[a]] / scale[a] * y[r];
        for (size_t c = 0; c < cols.size(); ++c) A[a][c] += X[r][cols[a]] / scale[a] * X[r][cols[c]] / scale[c];
      }
    }
    if (!solve(A, b, &x)) continue;
    bool nonneg = true;
    for (double v : x) nonneg &= v >= 0;
    if (!nonneg) continue;
    std::vector<double> coef(p, 0.0);
    for (size_t a = 0; a < cols.size(); ++a) coef[cols[a]] = x[a] / scale[a];
    double sse = 0;
    for (size_t r = 0; r < X.size(); ++r) {
      double pred = 0;
      for (size_t c = 0; c < p; ++c) pred += coef[c] * X[r][c];
      sse += (pred - y[r]) * (pred - y[r]);
    }
    if (sse < best_sse) {
      best_sse = sse;
      best = coef;
    }
  }
  return best;
}

}  // namespace swapnet
