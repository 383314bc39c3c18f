// The environment variables and ~/.aws files the AWS CLI and SDKs read, shared by the S3 client's configuration
// (s3_config.cpp) and its credentials chain (credentials.cpp), and the small pieces of AWS's wire format both the S3
// client and STS calls need (s3_client.cpp). Internal (src/include).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// The current UTC time as SigV4's x-amz-date (YYYYMMDDTHHMMSSZ).
std::string amz_now();
// The Code and Message of an S3 or STS error body (<Error> at the root or inside <ErrorResponse>); empty strings when
// the body is not such a document (an error's body is only read for a message, so it never throws).
std::pair<std::string, std::string> error_code_message(std::string_view body);

}  // namespace tessera::storage::aws
