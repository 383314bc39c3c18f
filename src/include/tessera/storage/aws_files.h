// The environment variables and ~/.aws files the AWS CLI and SDKs read, shared by the S3 client's configuration
// (s3_config.cpp) and its credentials chain (credentials.cpp). Internal (src/include).
#pragma once

#include <map>
#include <string>

namespace tessera::storage::aws {

// The variable's value, "" when unset.
std::string env(const char* name);
// AWS_PROFILE, else AWS_DEFAULT_PROFILE, else "default".
std::string profile_name();
// AWS_CONFIG_FILE (default ~/.aws/config) and AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials).
std::string config_file();
std::string credentials_file();
// The top-level `key = value` pairs of one section of an AWS INI file (nested, indented sub-sections are skipped);
// empty when the file or the section is missing.
std::map<std::string, std::string> ini_section(const std::string& path, const std::string& section);
// A profile's settings in the config file ("[profile NAME]", "[default]").
std::map<std::string, std::string> config_profile(const std::string& name);
// The region: AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, else us-east-1.
std::string region();

}  // namespace tessera::storage::aws
