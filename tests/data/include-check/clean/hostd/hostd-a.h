#include "hostd-b.h"
