// Checks the test PKI helper (tests/util/test_pki.h) with openssl itself, so
// that a TLS test failing because of a bad fixture is told apart from one
// failing because of the code under test.
#include "tests/util/test_pki.h"

#include <stdlib.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace mesh::testing {
namespace test_pki_test {

class TestPkiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveOpenssl()) GTEST_SKIP() << "the openssl binary is not on PATH";
    std::string tmpl = ::testing::TempDir() + "test_pki_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    absl::StatusOr<TestPki> pki = MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  bool Verifies(const std::string& ca, const std::string& cert) {
    return RunOpenssl({"verify", "-CAfile", ca, cert}).ok();
  }
  // `openssl x509 -checkend 0` exits 0 when the certificate has not expired.
  bool Unexpired(const std::string& cert) {
    return RunOpenssl({"x509", "-in", cert, "-noout", "-checkend", "0"}).ok();
  }

  std::string dir_;
  TestPki pki_;
};

TEST_F(TestPkiTest, ChainsAndValidity) {
  EXPECT_TRUE(Verifies(pki_.ca_cert, pki_.server_cert));
  EXPECT_TRUE(Verifies(pki_.ca_cert, pki_.client_cert));
  EXPECT_TRUE(Verifies(pki_.other_ca_cert, pki_.other_server_cert));
  EXPECT_TRUE(Verifies(pki_.other_ca_cert, pki_.other_client_cert));
  EXPECT_FALSE(Verifies(pki_.ca_cert, pki_.other_server_cert));
  EXPECT_FALSE(Verifies(pki_.other_ca_cert, pki_.client_cert));
  // Signed by the first CA, but verification fails only because of its dates.
  EXPECT_FALSE(Verifies(pki_.ca_cert, pki_.expired_client_cert));
  EXPECT_TRUE(
      RunOpenssl({"verify", "-no_check_time", "-CAfile", pki_.ca_cert, pki_.expired_client_cert})
          .ok());

  EXPECT_TRUE(Unexpired(pki_.ca_cert));
  EXPECT_TRUE(Unexpired(pki_.server_cert));
  EXPECT_TRUE(Unexpired(pki_.client_cert));
  EXPECT_TRUE(Unexpired(pki_.other_server_cert));
  EXPECT_FALSE(Unexpired(pki_.expired_client_cert));
}

TEST_F(TestPkiTest, ServerCertNamesLocalhost) {
  absl::StatusOr<std::string> text =
      RunOpenssl({"x509", "-in", pki_.server_cert, "-noout", "-ext", "subjectAltName"});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("DNS:localhost"), std::string::npos) << *text;
  EXPECT_NE(text->find("IP Address:127.0.0.1"), std::string::npos) << *text;
}

TEST_F(TestPkiTest, KeysMatchCertificates) {
  for (const auto& [cert, key] : {std::pair{pki_.server_cert, pki_.server_key},
                                  {pki_.client_cert, pki_.client_key},
                                  {pki_.other_server_cert, pki_.other_server_key},
                                  {pki_.expired_client_cert, pki_.expired_client_key}}) {
    absl::StatusOr<std::string> from_cert = RunOpenssl({"x509", "-in", cert, "-noout", "-pubkey"});
    absl::StatusOr<std::string> from_key = RunOpenssl({"pkey", "-in", key, "-pubout"});
    ASSERT_TRUE(from_cert.ok()) << from_cert.status();
    ASSERT_TRUE(from_key.ok()) << from_key.status();
    EXPECT_EQ(*from_cert, *from_key) << cert;
  }
}

}  // namespace test_pki_test
}  // namespace mesh::testing
